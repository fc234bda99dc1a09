"""Muon under ZeRO 1-3: whole-matrix updates from flat partitioned shards.

The ZeRO strategies (``engine/zero/stage12.py``, stage 3 through it) hand the optimizer one flat
shard parameter per bucket, this rank's chunk, with the reduced (averaged, clipped, unscaled)
gradient chunk as its ``.grad``; a matrix may straddle chunks, i.e. ranks. Newton-Schulz needs
the whole matrix, so, before the step, for every bucket of a Muon param group:

1. the momentum is updated on the chunk, elementwise (M <- lerp(M, G, 1 - beta)), and so is the
   nesterov blend U: the momentum buffer stays partitioned exactly like an Adam state (each rank
   keeps its chunk, a checkpoint stores it per shard like any other state);
2. U's chunks are all-gathered into the whole bucket (one ``all_gather_into_tensor`` per bucket
   over the group's partition ranks: the same collective and volume as the parameter all-gather
   that follows the step);
3. each rank orthogonalizes every matrix that has elements in its chunk, whole, and keeps its
   slice of the result as the shard's ``.grad``; ``Muon.step`` then applies decay and step.

A matrix split between ranks is orthogonalized by each of them (the same numbers: the same
input, the same deterministic ops), as DeepSpeed's ZeRO 1/2 does; the others are computed once.
With ``offload_optimizer: cpu`` the chunks live on the CPU: U goes to the device for the
all-gather and Newton-Schulz, the slice comes back. Gradient clipping and the loss scale act on
the gradient before the momentum (the strategy scales ``.grad`` first), as in a single process.
"""

from __future__ import annotations

import torch

from dslaunch.engine.optim.newton_schulz import momentum_update_, ns_dtype, orthogonalize


def _partition(strategy, g):
    """(comm, world size, rank) this group's buckets are chunked over."""
    comm = getattr(g, "comm", None)
    if comm is not None:  # stages 1-2: the data-parallel (or an expert-data-parallel) group
        return comm, g.world, g.rank
    return strategy.part_comm, strategy.world, strategy.rank  # stage 3 (MiCS: its shard group)


@torch.no_grad()
def orthogonalize_shards(optimizer, strategy) -> None:
    for g, pg in zip(strategy.groups, optimizer.param_groups):
        if not pg.get("use_muon"):
            continue
        comm, world, rank = _partition(strategy, g)
        dtype_cache = {}
        for b, sp in zip(g.layout.buckets, pg["params"]):
            grad = sp.grad
            if grad is None:
                grad = torch.zeros_like(sp)
            state = optimizer.state[sp]
            buf = state.get("momentum_buffer")
            if buf is None or buf.numel() != grad.numel():
                buf = state["momentum_buffer"] = torch.zeros_like(grad)
            u = momentum_update_(grad, buf, pg["momentum"], pg["nesterov"])
            dev = strategy.device
            whole = torch.empty(b.numel, dtype=u.dtype, device=dev)
            if world > 1:
                comm.all_gather_into_tensor(whole, u.to(dev))
            else:
                whole.copy_(u)
            c = b.chunk(world)
            lo_c, hi_c = rank * c, (rank + 1) * c
            out = torch.zeros(c, dtype=grad.dtype, device=dev)
            for s in b.slots:
                lo, hi = max(s.start, lo_c), min(s.start + s.numel, hi_c)
                if lo >= hi:
                    continue
                if dev not in dtype_cache:
                    dtype_cache[dev] = ns_dtype(pg["ns_method"], dev, pg["ns_dtype"])
                mat = whole[s.start: s.start + s.numel].view(s.shape)
                o = orthogonalize(mat, steps=pg["ns_steps"], method=pg["ns_method"],
                                  dtype=dtype_cache[dev]).reshape(-1)
                out[lo - lo_c: hi - lo_c].copy_(o[lo - s.start: hi - s.start])
            sp.grad = out.to(sp.device) if out.device != sp.device else out
            optimizer.prepared.add(id(sp))


__all__ = ["orthogonalize_shards"]
