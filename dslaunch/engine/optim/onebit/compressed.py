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
(all_gather). Sent to the other ranks (``comm_stats()`` ``sent_bytes``, see ``engine/comm/collectives.py``):
``(w-1) * (c/8 + 4k)`` twice, against ``2(w-1) * 4c`` for a ring fp32 all-reduce of the same
``w*c`` values: ``32 / (1 + 32/block_size)`` times fewer bytes whatever ``w`` is (31.5x with the
default block of 2048; 15.75x against bf16). Payload ratios differ (21x on 2 ranks) because a
payload counts the all_to_all's own chunk, which never leaves the rank, and an all-reduce's
buffer once, whatever the algorithm moves: they are not bytes on the network. Both collectives
are booked in the engine's ``Comm`` accounting as ``onebit_all_to_all`` and ``onebit_all_gather``.

The 1-bit optimizers pass ``segments`` (their parameters' sizes): each parameter is then cut
into chunks and blocks of its own, as above, and rank ``j``'s row is its chunk of every parameter
one after the other, so no scale is shared by two parameters (DeepSpeed compresses each
parameter on its own too); ``c`` and ``k`` above become sums over the parameters (padding to
whole sign bytes and one more scale per parameter: +0.65% bytes on the 135k-parameter test GPT).

Sign of 0 is +1 (one bit has no zero); padding positions never carry error from one call to the
next. The compression (``x + error``, block norms, signs packed 8 per byte straight into the
send buffer, the new error) and the decoding are two kernels, ``pack`` and ``decode``: on CPU the
compiled op ``onebit_pack`` (``cpp/cpu/onebit_pack.cpp``, one pass over memory each, OpenMP),
elsewhere or when it cannot be built the torch versions below (several passes); the tests hold
the two equal. The wire buffers are allocated once, and a contiguous fp32 tensor is compressed
and overwritten in place: no copy of it is made. The error buffers are per rank and belong in
that rank's checkpoint (``state_dict``).
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


# -- the two kernels, torch versions (the compiled op cpp/cpu/onebit_pack.cpp must equal them) --
#
# Wire layout: blocks of ``block`` values grouped in rows of ``row_blocks`` blocks; a row is
# ``row_blocks * block / 8`` bytes of signs (element 8i+k in bit k of byte i, 1 = non-negative)
# then ``row_blocks`` fp32 scales. One row per destination rank, so a row is what one rank sends
# another in the all_to_all, and what it contributes to the all_gather.

def pack_torch(x: torch.Tensor, err: torch.Tensor, n_valid: int, block: int, row_blocks: int,
               out: torch.Tensor, wire_off: int = 0, row_stride: int = 0) -> None:
    """``c = x + err`` on the first ``n_valid`` values (later ones count as 0); per block
    ``scale = ||c|| / sqrt(valid values)``; signs and scales into ``out`` (uint8 rows);
    ``err = c - (+-scale)`` on valid positions, 0 beyond (padding never carries error).
    ``x``: >= n_valid fp32 values; ``err``: fp32, a whole number of rows of blocks, zero beyond
    n_valid on entry (the invariant this function keeps). Row ``r`` goes to byte
    ``wire_off + r * row_stride`` of ``out`` (default: the rows one after the other)."""
    nblocks = err.numel() // block
    rows = nblocks // row_blocks
    err[:n_valid].add_(x[:n_valid])
    c = err.view(nblocks, block)
    counts = (n_valid - torch.arange(nblocks, device=err.device) * block).clamp(0, block)
    norms = torch.linalg.vector_norm(c, dim=1)
    scales = torch.where(counts > 0, norms / counts.clamp(min=1).float().sqrt(),
                         torch.zeros_like(norms))
    bits = c >= 0
    c.sub_((bits.float() * 2 - 1) * scales[:, None])
    err[n_valid:].zero_()
    sign_bytes = row_blocks * block // 8
    o = out.view(rows, row_stride or -1)[:, wire_off:wire_off + sign_bytes + 4 * row_blocks]
    o[:, :sign_bytes].copy_(pack_bits(bits).view(rows, sign_bytes))
    o[:, sign_bytes:].copy_(scales.view(rows, row_blocks).view(torch.uint8))


def decode_torch(rows_in: torch.Tensor, nrows: int, row_blocks: int, block: int,
                 out: torch.Tensor, n_out: int, alpha: float, sum_rows: bool,
                 wire_off: int = 0, row_stride: int = 0) -> None:
    """``sum_rows``: ``out[i] = alpha * sum over rows of row r's value i``; else the rows' values
    one after the other: ``out[r * row + i] = alpha * row r's value i``; only ``n_out`` values of
    ``out`` are written. Row ``r`` is read at byte ``wire_off + r * row_stride`` of
    ``rows_in`` (default: the rows one after the other)."""
    sign_bytes = row_blocks * block // 8
    g = rows_in.view(nrows, row_stride or -1)[:, wire_off:wire_off + sign_bytes + 4 * row_blocks]
    bits = unpack_bits(g[:, :sign_bytes].contiguous()).view(nrows * row_blocks, block)
    scales = g[:, sign_bytes:].reshape(-1).clone().view(torch.float32)  # clone: 4-byte aligned
    vals = (bits.float() * 2 - 1) * (scales * alpha)[:, None]
    if sum_rows:
        row = row_blocks * block
        vals = vals.view(nrows, row).sum(dim=0)
        k = min(row, n_out)
        out[:k].copy_(vals[:k])
    else:
        out[:n_out].copy_(vals.view(-1)[:n_out])


class _Compiled:
    """The same two kernels from the compiled op (fp32, contiguous CPU tensors)."""

    def __init__(self, op):
        self.op = op

    def pack(self, x, err, n_valid, block, row_blocks, out, wire_off=0, row_stride=0):
        nblocks = err.numel() // block
        row_bytes = row_stride or out.numel() // (nblocks // row_blocks)
        self.op.pack(x.data_ptr(), err.data_ptr(), n_valid, nblocks, block,
                     out.data_ptr() + wire_off, row_blocks, row_bytes, torch.get_num_threads())

    def decode(self, rows_in, nrows, row_blocks, block, out, n_out, alpha, sum_rows, wire_off=0,
               row_stride=0):
        self.op.decode(rows_in.data_ptr() + wire_off, nrows,
                       row_stride or rows_in.numel() // nrows, row_blocks, block, out.data_ptr(),
                       n_out, float(alpha), int(bool(sum_rows)), torch.get_num_threads())


class _Torch:
    pack = staticmethod(pack_torch)
    decode = staticmethod(decode_torch)


def kernels(device, use_compiled: bool = True):
    """The compiled op's kernels for CPU tensors when it can be had, else the torch ones."""
    if use_compiled and torch.device(device).type == "cpu":
        from dslaunch.kernels import load_op

        op = load_op("onebit_pack")
        if op is not None:
            return _Compiled(op)
    return _Torch()


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
    fp32 scale: 4 bytes per ``block_size/8`` bytes of signs). ``use_compiled``: pack/decode with
    the compiled CPU op ``onebit_pack`` when it loads (``self.compiled`` says whether it did),
    else torch. Keep one instance per tensor layout: it owns that layout's worker and server
    error buffers and the wire buffers, reused every call.

    ``segments``: the sizes of the consecutive pieces of the tensor that must never share a scale
    (the parameters, when the tensor is all of them flattened; default: one piece). Each segment
    is cut into ``world`` chunks and blocks of its own, as DeepSpeed compresses each parameter
    on its own: a block that straddled two parameters gave a LayerNorm gain or a bias the scale
    of its neighbour matrix. Measured on 0/1 Adam at 1000 steps (seed 0): +3.7% -> +3.2% vs
    Adam; 64-value blocks (finer, 21x instead of 31x fewer bytes) gave +1.7%, so most of what
    scales cost there is their coarseness within a parameter, not the straddling
    (benchmarks/results/onebit-zero-one-*). A rank's row on the wire is its chunk of every
    segment, one after the other; with one segment it is the layout described at the top of
    this file."""

    def __init__(self, numel: int, device=None, comm=None, block_size: int = DEFAULT_BLOCK,
                 use_compiled: bool = True, segments=None):
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
        sizes = [int(x) for x in (segments if segments is not None else [self.numel])]
        if sum(sizes) != self.numel or any(x < 0 for x in sizes):
            raise ValueError(f"segments: sizes {sizes[:8]}... do not add up to {self.numel}")
        self.segments = sizes
        # per segment: (start in the tensor, size, block, blocks per rank chunk, chunk, offset
        # of its chunk in a wire row, in the server buffer, in the worker error buffer)
        self._segs, start, wire, srv = [], 0, 0, 0
        for size in [x for x in sizes if x] or [0]:
            per_rank = -(-size // self.world)  # elements per rank chunk, rounded up
            per_rank = max(8, -(-per_rank // 8) * 8)  # to whole bytes of signs
            block = min(int(block_size), per_rank)
            blocks = -(-per_rank // block)
            chunk = blocks * block
            self._segs.append((start, size, block, blocks, chunk, wire, srv, self.world * srv))
            start, wire, srv = start + size, wire + chunk // 8 + 4 * blocks, srv + chunk
        self.block = max(sg[2] for sg in self._segs)  # the largest block (the only one: 1 segment)
        self.blocks = sum(sg[3] for sg in self._segs)  # blocks per rank chunk
        self.chunk = srv  # values per rank chunk, padding included
        self.padded = self.chunk * self.world
        self.row_bytes = wire  # one rank's chunk on the wire
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.worker_error = torch.zeros(self.padded, dtype=torch.float32, device=self.device)
        self.server_error = torch.zeros(self.chunk, dtype=torch.float32, device=self.device)
        self.kernels = kernels(self.device, use_compiled)
        self.compiled = isinstance(self.kernels, _Compiled)
        self._buffers = None
        self.calls = 0

    def _wire(self):
        """send/recv rows of the all_to_all, the server's average, the all_gather's rows."""
        if self._buffers is None:
            u8 = dict(dtype=torch.uint8, device=self.device)
            w, rb = self.world, self.row_bytes
            self._buffers = (torch.empty(w * rb, **u8), torch.empty(w * rb, **u8),
                             torch.empty(self.chunk, dtype=torch.float32, device=self.device),
                             torch.empty(rb, **u8), torch.empty(w * rb, **u8))
        return self._buffers

    # -- wire sizes (what one call hands to the collectives on this rank) -------------------------
    @property
    def bytes_per_call(self) -> int:
        if self.world == 1:
            return 0
        return self.row_bytes * self.world + self.row_bytes  # all_to_all + all_gather

    def reset_errors(self) -> None:
        self.worker_error.zero_()
        self.server_error.zero_()

    # -- the collective ---------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace ``tensor`` (``numel`` elements, any float dtype) by the compressed average over
        the group; returns it. A contiguous fp32 tensor is read and written in place, with no
        copy."""
        if tensor.numel() != self.numel:
            raise ValueError(f"compressed all-reduce set up for {self.numel} elements, got "
                             f"{tensor.numel()}")
        self.calls += 1
        k = self.kernels
        w, rb = self.world, self.row_bytes
        direct = tensor.dtype == torch.float32 and tensor.is_contiguous()
        flat = tensor.view(-1) if direct else tensor.reshape(-1).float()
        send, recv, avg, gsend, gathered = self._wire()

        # worker: compress x + worker_error, one row per destination rank
        for start, n, blk, nb, chunk, wire, _, err in self._segs:
            k.pack(flat[start:start + n], self.worker_error[err:err + w * chunk], n, blk, nb, send,
                   wire, rb)
        if w == 1:
            recv = send
        else:
            _book(self.comm, "onebit_all_to_all", send.numel(),
                  lambda: dist.all_to_all_single(recv, send, group=self.group))

        # server: average of my chunk over the workers, compressed again with its own error
        for _start, n, blk, nb, chunk, wire, srv, _ in self._segs:
            valid_n = min(max(n - self.rank * chunk, 0), chunk)
            mine = avg[srv:srv + chunk]
            k.decode(recv, w, nb, blk, mine, valid_n, 1.0 / w, True, wire, rb)
            k.pack(mine, self.server_error[srv:srv + chunk], valid_n, blk, nb, gsend, wire, rb)
        if w == 1:
            gathered = gsend
        else:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            _book(self.comm, "onebit_all_gather", gsend.numel(),
                  lambda: gather(gathered, gsend, group=self.group))
        for start, n, blk, nb, _chunk, wire, _, _ in self._segs:
            k.decode(gathered, w, nb, blk, flat[start:start + n], n, 1.0, False, wire, rb)
        if not direct:
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    # -- state (per rank) ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"numel": self.numel, "world_size": self.world, "segments": list(self.segments),
                "worker_error": self.worker_error.clone(),
                "server_error": self.server_error.clone()}

    def load_state_dict(self, sd: dict) -> bool:
        """Restore the error buffers; False (buffers zeroed) when the layout differs (another
        world size, tensor size or segments): error feedback then restarts from zero, which is
        safe."""
        if (int(sd.get("numel", -1)) != self.numel or int(sd.get("world_size", -1)) != self.world
                or list(sd.get("segments", [self.numel])) != self.segments
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
    """Bytes one rank sends for a payload (``engine/comm/collectives.sent_bytes``, the definition
    ``comm_stats()`` books as ``sent_bytes``)."""
    from dslaunch.engine.comm.collectives import sent_bytes

    return float(sent_bytes(collective, int(payload), world))


__all__ = ["CompressedAllReduce", "pack_bits", "unpack_bits", "pack_torch", "decode_torch",
           "kernels", "fp32_allreduce_bytes", "wire_bytes"]
