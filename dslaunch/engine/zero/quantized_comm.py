"""ZeRO++'s quantized collectives for stage 3: qwZ (``zero_quantized_weights``) and qgZ
(``zero_quantized_gradients``).

qwZ, ``quantized_all_gather``: a bucket's parameter all-gather sends each rank's chunk as int8
blocks (``block`` values, default 2048, one fp32 scale each; ``dslaunch/kernels/quantize.py``)
and every rank dequantizes what it receives into the bucket's full buffer (fp32 or bf16). On the
wire: ``c + 4 * ceil(c / block)`` bytes (padded to 4) per rank chunk of ``c`` values instead of
``4c`` (fp32) or ``2c`` (bf16): 3.99x / 1.99x fewer. Every gathered weight is within
``max|block| / 254`` of the shard's value. Only the copies that forward and backward compute
with are quantized: the shard each rank holds, the fp32 masters and the optimizer states never
are, and the gathers that read or write weights (checkpoints, ``module_state_dict``,
``GatheredParameters``) stay exact (``ParamStore.gather(exact=True)``).

qgZ, ``HierarchicalReduceScatter``: a bucket's gradient reduce-scatter in two levels over the
host groups (``engine/comm/host_groups.py``; L ranks per host, H hosts, rank ``h*L + l``):

1. intra-host, full precision: the bucket is reordered so that local rank ``l`` receives the
   chunks of ranks ``l, L+l, 2L+l, ...`` (its peers with the same local rank on every host), and
   reduce-scattered within the host: local rank ``l`` holds the host's sum of those H chunks;
2. inter-host, quantized: each of those H chunks (destined to host ``h``'s rank with local rank
   ``l``) is quantized (int4 by default, as DeepSpeed's qgZ; or int8; blocks of 256 values, one
   fp32 scale each) and exchanged with ONE ``all_to_all`` among the ranks of local rank ``l``;
   each rank dequantizes the H-1 chunks from the other hosts and adds them, in fp32, to its own
   host's (never quantized) sum.

So only the inter-host traffic is quantized: per rank ``(H-1)/H`` of its ``H`` quantized chunks
(int4: ``c/2 + 4c/256`` bytes per chunk, 7.5x fewer than fp32), where a flat reduce-scatter sends
``(W-1)/W`` of ``W`` full-precision chunks over the network. The result for a rank's chunk is
within ``sum over the other hosts of max|block| / 14`` (int4; ``/ 254`` int8) per element of the
exact sum (each host's partial sum is rounded once). With one host it is a plain reduce-scatter.

Bytes are booked in the engine's ``comm_stats()`` under their own names, each with its group's
size for ``sent_bytes``: ``qwz_all_gather``, ``qgz_intra_reduce_scatter``,
``qgz_inter_all_to_all`` (``engine/comm/collectives.py`` explains ``bytes`` and ``sent_bytes``).

Tunables (environment, read once): ``DSLAUNCH_QWZ_BLOCK`` (2048), ``DSLAUNCH_QGZ_BITS`` (4 or
8; default 4) and ``DSLAUNCH_QGZ_BLOCK`` (256).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from dslaunch.engine.comm import host_groups
from dslaunch.engine.comm.collectives import Comm
from dslaunch.kernels import quantize as Q

WEIGHT_BITS, WEIGHT_BLOCK = 8, 2048
GRAD_BITS, GRAD_BLOCK = 4, 256


def _env_int(name: str, default: int, allowed=None) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0 or (allowed is not None and value not in allowed):
        want = " or ".join(map(str, allowed)) if allowed else "a positive integer"
        raise ValueError(f"{name}={raw!r}: expected {want}")
    return value


class GroupComm(Comm):
    """A ``Comm`` over a sub-group whose calls are booked in another ``Comm``'s stats (so
    ``engine.comm_stats()`` shows them) under ``prefix + name``, with this group's size."""

    def __init__(self, group, parent: Comm, prefix: str):
        super().__init__(group)
        self._stats = parent._stats
        self.prefix = prefix
        host_groups.label(self)  # its bytes also split by link: intra-host or inter-host

    def _book(self, name, nbytes, path=None, sent_nbytes=None):
        return super()._book(self.prefix + name, nbytes, path, sent_nbytes)

    def all_to_all_single(self, output, input, async_op=False):
        return self._run("all_to_all", self._nbytes(input),
                         lambda a: dist.all_to_all_single(output, input, group=self.group,
                                                          async_op=a), async_op)


class _Row:
    """One quantized chunk of ``n`` values on the wire: the values (padded to 4 bytes) then the
    fp32 scales, so a row of a uint8 buffer views its scales without a copy."""

    def __init__(self, n: int, bits: int, block: int):
        self.n, self.bits, self.block = n, bits, block
        self.qbytes = Q.qbytes(n, bits)
        self.scale_off = -(-self.qbytes // 4) * 4
        self.nbytes = self.scale_off + 4 * Q.nblocks(n, block)

    def quantize(self, x: torch.Tensor, row: torch.Tensor) -> None:
        Q.quantize_into(x, self.bits, self.block, row[:self.qbytes],
                        row[self.scale_off:self.nbytes].view(torch.float32))

    def dequantize(self, row: torch.Tensor, out: torch.Tensor, accumulate=False) -> None:
        Q.dequantize(row[:self.qbytes], row[self.scale_off:self.nbytes].view(torch.float32),
                     self.n, self.bits, self.block, out=out, accumulate=accumulate)


class _Dequantizing:
    """An async all-gather's handle: ``wait()`` waits for the bytes, then dequantizes them."""

    def __init__(self, work, finish):
        self._work, self._finish = work, finish

    def wait(self):
        self._work.wait()
        if self._finish is not None:
            self._finish()
            self._finish = None
        return True

    def is_completed(self):
        return self._finish is None or self._work.is_completed()


def quantized_all_gather(comm: Comm, full: torch.Tensor, src: torch.Tensor,
                         bits: int = WEIGHT_BITS, block: int = WEIGHT_BLOCK, async_op=False):
    """``full`` (world x ``src.numel()`` values, fp32 or bf16) gets every rank's ``src``,
    each quantized to ``bits`` in blocks of ``block`` and dequantized on receipt (also this
    rank's own, so every rank computes with the same weights). Async: a handle whose ``wait()``
    also dequantizes."""
    c, w = src.numel(), comm.world_size
    row = _Row(c, bits, block)
    send = torch.empty(row.nbytes, dtype=torch.uint8, device=src.device)
    row.quantize(src.reshape(-1), send)
    recv = torch.empty(w * row.nbytes, dtype=torch.uint8, device=src.device)
    work = comm.all_gather_into_tensor(recv, send, async_op=async_op)
    flat = full.view(-1)

    def finish():
        for r in range(w):
            row.dequantize(recv[r * row.nbytes:(r + 1) * row.nbytes], flat[r * c:(r + 1) * c])

    if async_op:
        return _Dequantizing(work, finish)
    finish()
    return None


class HierarchicalReduceScatter:
    """qgZ's reduce-scatter (see the module docstring) over ``groups`` (a
    ``host_groups.HostLayout``), booked in ``comm``'s stats."""

    def __init__(self, comm: Comm, groups, bits: int = GRAD_BITS, block: int = GRAD_BLOCK):
        self.comm, self.groups, self.bits, self.block = comm, groups, bits, block
        self.intra = GroupComm(groups.intra, comm, "qgz_intra_") if groups.intra else None
        self.inter = GroupComm(groups.inter, comm, "qgz_inter_") if groups.inter else None

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """``out`` (``c`` values) = this rank's chunk of the sum over all ranks of ``inp``
        (world x c values, contiguous; used as scratch)."""
        g = self.groups
        L, H, c = g.local_size, g.hosts, out.numel()
        if inp.numel() != L * H * c:
            raise ValueError(f"qgZ reduce-scatter: input has {inp.numel()} values, expected "
                             f"{L * H} x {c}")
        # 1) within the host: local rank l gets the host's sum of chunks l, L+l, 2L+l, ...
        if L > 1:
            mine = torch.empty(H * c, dtype=inp.dtype, device=inp.device)
            by_local = inp.view(H, L, c).transpose(0, 1).contiguous().view(-1)
            self.intra.reduce_scatter_tensor(mine, by_local, input_is_scratch=True)
        else:
            mine = inp.view(-1)
        pieces = mine.view(H, c)
        if H == 1:
            out.copy_(pieces[0])
            return
        # 2) across hosts: piece h goes, quantized, to host h's rank of this local rank
        row = _Row(c, self.bits, self.block)
        send = torch.empty(H * row.nbytes, dtype=torch.uint8, device=inp.device)
        for h in range(H):
            if h != g.host:  # our own piece never leaves the rank: not quantized
                row.quantize(pieces[h], send[h * row.nbytes:(h + 1) * row.nbytes])
        recv = torch.empty_like(send)
        self.inter.all_to_all_single(recv, send)
        acc = pieces[g.host].float() if pieces.dtype != torch.float32 else pieces[g.host].clone()
        for h in range(H):
            if h != g.host:
                row.dequantize(recv[h * row.nbytes:(h + 1) * row.nbytes], acc, accumulate=True)
        out.copy_(acc)


def host_layout_of(comm):
    """The host layout qgZ reduces over, for ``comm`` (the data-parallel group, which must be the
    whole world: one layout per world); collective on first use."""
    world = dist.get_world_size()
    if comm.world_size != world:  # several data-parallel groups would each need their own
        raise ValueError("zero_optimization.zero_quantized_gradients: the data-parallel group "
                         f"must be the whole world for now ({comm.world_size} of {world} ranks: "
                         "no pipeline, tensor or sequence parallelism with qgZ)")
    return host_groups.host_layout()


class ZeroPPComm:
    """What stage 3 asks for: ``weights`` (an all-gather callable for ``ParamStore``, or None)
    and ``gradients`` (a reduce-scatter callable, or None), from the typed ``zero`` section."""

    def __init__(self, zero, comm: Comm):
        self.weights = self.gradients = None
        if comm.world_size <= 1:
            return
        if getattr(zero, "zero_quantized_weights", False):
            w_block = _env_int("DSLAUNCH_QWZ_BLOCK", WEIGHT_BLOCK)
            qcomm = GroupComm(comm.group, comm, "qwz_")

            def gather(full, src, async_op=False):
                return quantized_all_gather(qcomm, full, src, WEIGHT_BITS, w_block, async_op)

            self.weights = gather
        if getattr(zero, "zero_quantized_gradients", False):
            bits = _env_int("DSLAUNCH_QGZ_BITS", GRAD_BITS, (4, 8))
            g_block = _env_int("DSLAUNCH_QGZ_BLOCK", GRAD_BLOCK)
            if bits == 4 and g_block % 2:
                raise ValueError(f"DSLAUNCH_QGZ_BLOCK={g_block}: int4 needs an even block")
            self.gradients = HierarchicalReduceScatter(comm, host_layout_of(comm), bits, g_block)
