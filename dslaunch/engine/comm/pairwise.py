"""Reduce-scatter and all-gather as pairwise point-to-point exchanges over torch.distributed.

Why: on gloo over TCP, ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` move each byte
several times slower than ``all_reduce`` does (``benchmarks/bench_collectives.py``), and ZeRO
stages 1-3 live on those two. Gloo's own send/recv runs at the link's speed, so here every rank
exchanges its pieces with every other rank directly, all posted at once (no step waits on
another: the work can stay in flight behind backward like any async collective):

- reduce-scatter: rank r sends chunk j of its input to rank j and receives chunk r from every
  rank, then sums the N pieces of its chunk in rank order (the same order on every rank, so the
  result does not depend on who arrived first);
- all-gather: rank r sends its input to every rank and receives each rank's chunk straight into
  its place in the output (no copy; the input may be this rank's own slot of the output).

Each rank sends ``(N-1)/N`` of the reduce-scatter input and ``N-1`` times the all-gather input:
the same bytes as the ring algorithms. Messages use tags above the 16-bit range the pipeline's
p2p channels use, one per collective, and the same posting order on every rank, so concurrent
buckets cannot take each other's messages.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

REDUCE_SCATTER_TAG = 0x10000 + 1
ALL_GATHER_TAG = 0x10000 + 2


class PairwiseWork:
    """The sends and receives of one pairwise collective; ``wait`` completes them and then runs
    ``finish`` (the reduction of the received pieces), once."""

    def __init__(self, works, finish=None, keep=()):
        self._works, self._finish = works, finish
        self._keep = keep  # buffers gloo reads from or writes to until the works complete
        self._done = False

    def wait(self):
        if not self._done:
            for w in self._works:
                w.wait()
            if self._finish is not None:
                self._finish()
            self._works, self._finish, self._keep = [], None, ()
            self._done = True
        return True

    def is_completed(self):
        return self._done or all(w.is_completed() for w in self._works)


def _started(work: PairwiseWork, async_op: bool):
    """The handle for an async call; a synchronous one completes here and returns None (the
    torch.distributed convention)."""
    if async_op:
        return work
    work.wait()
    return None


def _peers(rank: int, world: int):
    """(rank sent to, rank received from) for each of the N-1 exchanges, in the same order on
    every rank: step k sends to r+k and receives from r-k."""
    return [((rank + k) % world, (rank - k) % world) for k in range(1, world)]


def global_rank(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group, rank: int, world: int,
                   async_op: bool = False):
    """``output`` (one chunk) gets the sum over ranks of this rank's chunk of ``input``."""
    c = output.numel()
    flat = input.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    recv = torch.empty((world - 1, c), dtype=input.dtype, device=input.device)
    pieces = {rank: flat[rank * c:(rank + 1) * c]}
    works = []
    for k, (dst, src) in enumerate(_peers(rank, world)):
        works.append(dist.isend(flat[dst * c:(dst + 1) * c], global_rank(group, dst), group=group,
                                tag=REDUCE_SCATTER_TAG))
        works.append(dist.irecv(recv[k], global_rank(group, src), group=group,
                                tag=REDUCE_SCATTER_TAG))
        pieces[src] = recv[k]

    def finish():
        out = output.view(-1)
        out.copy_(pieces[0])
        for r in range(1, world):
            out.add_(pieces[r])

    return _started(PairwiseWork(works, finish, keep=(flat, recv)), async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group, rank: int, world: int,
               async_op: bool = False):
    """``output`` (world x ``input``, contiguous) gets every rank's ``input`` in rank order."""
    c = input.numel()
    flat = output.view(-1)
    src_t = input.reshape(-1)
    if not src_t.is_contiguous():
        src_t = src_t.contiguous()
    mine = flat[rank * c:(rank + 1) * c]
    if mine.data_ptr() != src_t.data_ptr():
        mine.copy_(src_t)
    works = []
    for dst, src in _peers(rank, world):
        works.append(dist.isend(mine, global_rank(group, dst), group=group, tag=ALL_GATHER_TAG))
        works.append(dist.irecv(flat[src * c:(src + 1) * c], global_rank(group, src), group=group,
                                tag=ALL_GATHER_TAG))
    return _started(PairwiseWork(works, keep=(flat,)), async_op)
