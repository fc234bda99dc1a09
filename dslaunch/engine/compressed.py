"""Error-compensated 1-bit all-reduce (the communication of 1-bit Adam, 0/1 Adam and 1-bit LAMB).

A tensor of ``numel`` fp32 values is averaged over the data-parallel ranks with one sign bit per
value plus one fp32 scale per block of ``block_size`` values, in two phases over ordinary
torch.distributed collectives (gloo and NCCL both have them):

1. worker: ``x = tensor + worker_error``; ``x`` is cut into ``world`` chunks (padded to whole
   blocks), each chunk into blocks; block ``b`` becomes ``s_b * sign(x_b)`` with
   ``s_b = ||x_b|| / sqrt(n_b)`` (the scale keeps the block's l2 norm); what the compression
   lost, ``x - s * sign(x)``, is kept in ``worker_error`` and added back next time. The signs,
   packed 8 per byte, and the scales go out in ONE ``all_to_all``: rank ``j`` receives every
   rank's chunk ``j``.
2. server: rank ``j`` decodes and averages its chunk from all ranks, adds ``server_error``,
   compresses the average again the same way (its loss kept in ``server_error``), and the packed
   chunks + scales are exchanged with ONE ``all_gather``; every rank decodes the same result.

Bytes per rank and call (``c`` = chunk, ``k`` = blocks per chunk, ``w`` ranks). Handed to the
collectives (``comm_stats()`` ``bytes``): ``w * (c/8 + 4k)`` (all_to_all) plus ``c/8 + 4k``
(all_gather). Sent to the other ranks (``comm_stats()`` ``sent_bytes``, see ``engine/comm.py``):
``(w-1) * (c/8 + 4k)`` twice, against ``2(w-1) * 4c`` for a ring fp32 all-reduce of the same
``w*c`` values: ``32 / (1 + 32/block_size)`` times fewer bytes whatever ``w`` is (31.5x with the
default block of 2048; 15.75x against bf16). Payload ratios differ (21x on 2 ranks) because a
payload counts the all_to_all's own chunk, which never leaves the rank, and an all-reduce's
buffer once, whatever the algorithm moves: they are not bytes on the network. Both collectives are booked in the engine's ``Comm`` accounting as
``onebit_all_to_all`` and ``onebit_all_gather``.

Sign of 0 is +1 (one bit has no zero); padding positions never carry error from one call to the
next. The error buffers are per rank and belong in that rank's checkpoint (``state_dict``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

_SHIFTS = {}


def _shifts(device) -> torch.Tensor:
    key = str(device)
    if key not in _SHIFTS:
        _SHIFTS[key] = torch.arange(8, dtype=torch.uint8, device=device)
    return _SHIFTS[key]


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Booleans (numel a multiple of 8) -> uint8, 8 per byte, element ``8i+k`` in bit ``k``."""
    if bits.numel() % 8:
        raise ValueError(f"pack_bits: {bits.numel()} bits is not a multiple of 8")
    b = bits.reshape(-1, 8).to(torch.uint8)
    return torch.bitwise_left_shift(b, _shifts(b.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """uint8 -> booleans (8 per byte), the inverse of :func:`pack_bits`."""
    p = packed.reshape(-1, 1)
    return (torch.bitwise_right_shift(p, _shifts(p.device)) & 1).reshape(-1).bool()


def compress(x: torch.Tensor, counts: torch.Tensor):
    """``x``: [chunks, chunk] fp32; ``counts``: real (unpadded) elements per chunk. Returns
    (bits [chunks, chunk] bool, scales [chunks] fp32, decoded [chunks, chunk])."""
    norms = torch.linalg.vector_norm(x, dim=1)
    scales = torch.where(counts > 0, norms / counts.clamp(min=1).sqrt(), torch.zeros_like(norms))
    bits = x >= 0
    decoded = torch.where(bits, scales[:, None], -scales[:, None])
    return bits, scales, decoded


def decode(bits: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.where(bits, scales[:, None], -scales[:, None])


DEFAULT_BLOCK = 2048  # elements per scale: 4 bytes of scale per 256 bytes of signs (1.6%)


def _book(comm, name: str, nbytes: int, fn) -> None:
    """Run a collective, booked in the engine's ``Comm`` accounting when there is one."""
    if comm is not None and hasattr(comm, "_book"):
        rec = comm._book(name, nbytes)
        start = time.perf_counter()
        fn()
        rec["seconds"] += time.perf_counter() - start
    else:
        fn()


class CompressedAllReduce:
    """Averages a 1-D fp32 tensor of ``numel`` elements over the group, 1 bit per element.

    ``comm``: the engine's accounting ``Comm`` (its ``group``, ``rank`` and ``world_size`` are
    used), or None for the default world group. ``block_size``: elements per scale (a multiple
    of 8; each rank's chunk is cut into blocks of at most this many elements, each with its own
    fp32 scale: 4 bytes per ``block_size/8`` bytes of signs). Keep one instance per tensor
    layout: it owns that layout's worker and server error buffers."""

    def __init__(self, numel: int, device=None, comm=None, block_size: int = DEFAULT_BLOCK):
        self.comm = comm
        self.group = getattr(comm, "group", None)
        if comm is not None:
            self.rank, self.world = comm.rank, comm.world_size
        else:
            self.rank = dist.get_rank() if dist.is_initialized() else 0
            self.world = dist.get_world_size() if dist.is_initialized() else 1
        if int(block_size) < 8 or int(block_size) % 8:
            raise ValueError(f"block_size: {block_size} is not a positive multiple of 8")
        self.numel = int(numel)
        per_rank = -(-self.numel // self.world)  # elements per rank chunk, rounded up
        per_rank = max(8, -(-per_rank // 8) * 8)  # to whole bytes of signs
        self.block = min(int(block_size), per_rank)
        self.blocks = -(-per_rank // self.block)  # blocks per rank chunk
        self.chunk = self.blocks * self.block
        self.padded = self.chunk * self.world
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        starts = torch.arange(self.world * self.blocks, dtype=torch.float32) * self.block
        self.counts = (self.numel - starts).clamp(0, self.block).to(self.device)  # per block
        self.worker_error = torch.zeros(self.padded, dtype=torch.float32, device=self.device)
        self.server_error = torch.zeros(self.chunk, dtype=torch.float32, device=self.device)
        self._buf = torch.zeros(self.padded, dtype=torch.float32, device=self.device)
        self.calls = 0

    # -- wire sizes (what one call hands to the collectives on this rank) -------------------------
    @property
    def bytes_per_call(self) -> int:
        if self.world == 1:
            return 0
        per_rank = self.chunk // 8 + 4 * self.blocks
        return per_rank * self.world + per_rank  # all_to_all + all_gather

    def reset_errors(self) -> None:
        self.worker_error.zero_()
        self.server_error.zero_()

    # -- the collective ---------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace ``tensor`` (1-D, ``numel`` elements, any float dtype) by the compressed average
        over the group; returns it."""
        if tensor.numel() != self.numel:
            raise ValueError(f"compressed all-reduce set up for {self.numel} elements, got "
                             f"{tensor.numel()}")
        self.calls += 1
        w, nb, blk, chunk, n = self.world, self.blocks, self.block, self.chunk, self.numel
        sign_bytes = chunk // 8
        x = self._buf
        x[:n].copy_(tensor.reshape(-1))
        x[n:].zero_()
        x.add_(self.worker_error)
        xb = x.view(w * nb, blk)
        bits, scales, decoded = compress(xb, self.counts)
        torch.sub(xb, decoded, out=self.worker_error.view(w * nb, blk))
        self.worker_error[n:].zero_()

        if w == 1:  # nothing to exchange: the server phase still runs, on our own chunk
            recv_bits, recv_scales = bits, scales
        else:
            send = torch.cat([pack_bits(bits).view(w, sign_bytes),
                              scales.view(w, nb).view(torch.uint8)], dim=1).contiguous()
            recv = torch.empty_like(send)
            _book(self.comm, "onebit_all_to_all", send.numel(),
                  lambda: dist.all_to_all_single(recv, send, group=self.group))
            recv_bits = unpack_bits(recv[:, :sign_bytes].contiguous()).view(w * nb, blk)
            recv_scales = recv[:, sign_bytes:].contiguous().view(torch.float32).view(w * nb)

        # server: average of my chunk over the workers, error-compensated re-compression
        avg = decode(recv_bits, recv_scales).view(w, chunk).sum(dim=0).div_(w)
        avg.add_(self.server_error)
        valid_n = min(max(n - self.rank * chunk, 0), chunk)
        avg[valid_n:].zero_()
        mine = self.counts[self.rank * nb:(self.rank + 1) * nb]
        sbits, sscales, sdecoded = compress(avg.view(nb, blk), mine)
        torch.sub(avg, sdecoded.view(chunk), out=self.server_error)
        self.server_error[valid_n:].zero_()

        if w == 1:
            all_bits, all_scales = sbits, sscales
        else:
            send = torch.cat([pack_bits(sbits), sscales.view(torch.uint8)]).contiguous()
            gathered = torch.empty(w * send.numel(), dtype=torch.uint8, device=send.device)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            _book(self.comm, "onebit_all_gather", send.numel(),
                  lambda: gather(gathered, send, group=self.group))
            g = gathered.view(w, -1)
            all_bits = unpack_bits(g[:, :sign_bytes].contiguous()).view(w * nb, blk)
            all_scales = g[:, sign_bytes:].contiguous().view(torch.float32).view(w * nb)
        out = decode(all_bits, all_scales).view(-1)[:n]
        tensor.view(-1).copy_(out)
        return tensor

    # -- state (per rank) ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"numel": self.numel, "world_size": self.world,
                "worker_error": self.worker_error.clone(),
                "server_error": self.server_error.clone()}

    def load_state_dict(self, sd: dict) -> bool:
        """Restore the error buffers; False (buffers zeroed) when the layout differs (another
        world size or tensor size): error feedback then restarts from zero, which is safe."""
        if (int(sd.get("numel", -1)) != self.numel or int(sd.get("world_size", -1)) != self.world
                or sd["worker_error"].numel() != self.padded):
            self.reset_errors()
            return False
        self.worker_error.copy_(sd["worker_error"])
        self.server_error.copy_(sd["server_error"])
        return True


def fp32_allreduce_bytes(numel: int) -> int:
    """The payload an fp32 all-reduce of ``numel`` values books (for ratios)."""
    return 4 * int(numel)


def wire_bytes(collective: str, payload: int, world: int) -> float:
    """Bytes one rank sends for a payload (``engine/comm.sent_bytes``, the definition
    ``comm_stats()`` books as ``sent_bytes``)."""
    from .comm import sent_bytes

    return float(sent_bytes(collective, int(payload), world))


__all__ = ["CompressedAllReduce", "pack_bits", "unpack_bits", "compress", "decode",
           "fp32_allreduce_bytes", "wire_bytes"]
