"""Copies of a neighbour's ZeRO 1-3 shard, so that a lost rank's optimizer state survives it
(in-process recovery, ``engine/recovery/``).

At ZeRO 1-2 every rank holds the whole model but only its own shard of the fp32 masters and the
optimizer states; at ZeRO 3 it holds only its shard of the parameters too: when a rank dies, its
shard exists nowhere else, and no survivor can hand it to a replacement. With ``dslaunch run
--recover in-process`` each rank therefore keeps a copy of one other rank's shard (its *ward*),
refreshed by a point-to-point exchange after every optimizer update: rank ``r`` sends its shard
to its *buddy* and receives its ward's. The buddy is the same local rank on the next host when
the job spans several hosts (a lost host takes its ranks' copies with it otherwise), else the
next rank.

Cost, per rank and per optimizer step: one shard of state sent and one received (for Adam in fp32:
2 x 4 bytes x parameters / world: the moments; with fp32 masters beside bf16 weights, or at
stage 3, whose weights the buddy does not hold, 3 x), and
that much more host memory for the copy. The exchange waits for its transfers before the step
returns: ``benchmarks/bench_shard_copies.py`` measures what that adds to a step.

A shard's ``version`` counts the updates applied to it (and loads): a recovery rebuilds state only
from shards that all carry one version (``consistent``), otherwise it refuses and the job restarts.
"""

from __future__ import annotations

import os

import torch


def _stride(world: int, per_host: int) -> int:
    """How far a rank's buddy is: one host on (same local rank) when hosts are whole, else 1."""
    return per_host if 1 <= per_host < world and world % per_host == 0 else 1


def buddy_of(rank: int, world: int, per_host: int) -> int:
    """Whom ``rank`` sends its shard to."""
    return (rank + _stride(world, per_host)) % world


def ward_of(rank: int, world: int, per_host: int) -> int:
    """Whose shard ``rank`` keeps a copy of (the rank whose buddy it is)."""
    return (rank - _stride(world, per_host)) % world


def _ranks_per_host() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)


def _weights_copied(strategy, g) -> bool:
    """Whether a copy carries the group's shard weights: the fp32 masters when kept apart from
    the weights, and at stage 3 the parameter shard itself; at stages 1-2 in fp32 the buddy reads
    them from its own all-gathered copy of the model."""
    return g.master is not None or strategy.stage == 3


def _live_state(strategy) -> list:
    """This rank's shard as the tensors that change with each update, in an order every rank
    agrees on: per optimizer group, the shard weights (``_weights_copied``), then per chunk each
    optimizer state of the chunk's size. (Scalar states such as Adam's step count are the same on
    every rank: a copy takes the holder's own.)"""
    out = []
    for gi, g in enumerate(strategy.groups):
        if g.master is not None:
            out.append(g.master)
        elif _weights_copied(strategy, g):
            out.append(strategy.local_param_shards()[gi])
        for sp in g.shard_params:
            state = strategy.optimizer.state.get(sp, {})
            out += [state[k] for k in sorted(state)
                    if torch.is_tensor(state[k]) and state[k].dim() > 0
                    and state[k].numel() == sp.numel()]
    return out


def _signature(tensors: list) -> list:
    return [(tuple(t.shape), t.dtype) for t in tensors]


class ShardCopies:
    """This rank's copy of its ward's shard, and the exchange that refreshes it."""

    def __init__(self):
        self.ward: int | None = None  # the ward's rank when the copy was taken
        self.version: int | None = None  # the ward's shard version in the copy (None: no copy)
        self._buffers: list = []  # the copy: _live_state's tensors of the ward

    def exchange(self, strategy) -> None:
        """Send this rank's shard to its buddy and take its ward's (every rank of the strategy's
        group calls this together). The live tensors are sent as they are (nothing changes them
        until the next update, after this returns) into buffers kept from one exchange to the
        next. A peer lost during the exchange leaves no copy if its shard did not arrive whole;
        the error is left to the collective that follows, which fails the same way and starts
        the recovery."""
        import torch.distributed as dist

        world, rank = strategy.comm.world_size, strategy.comm.rank
        if world < 2:
            self.ward = self.version = None
            return
        mine = _live_state(strategy)
        if _signature(self._buffers) != _signature(mine):  # first exchange, or new states
            self._buffers = [torch.empty_like(t) for t in mine]
        per_host = _ranks_per_host()
        buddy, ward = buddy_of(rank, world, per_host), ward_of(rank, world, per_host)
        group = strategy.comm.group
        version = torch.tensor([strategy.version], dtype=torch.int64)
        theirs = torch.empty(1, dtype=torch.int64)
        self.version = None  # the buffers are being overwritten
        sends = [dist.isend(t, _global(group, buddy), group=group) for t in [version] + mine]
        recvs = [dist.irecv(t, _global(group, ward), group=group)
                 for t in [theirs] + self._buffers]
        if not _wait(recvs):
            return  # the ward is gone: no copy of it
        self.ward, self.version = ward, int(theirs.item())
        _wait(sends)

    def held(self, strategy) -> dict:
        """{rank in the old world: its shard state dict (``checkpoint/zero_shards``) with
        ``version``}: this rank's own shard and its copy of its ward's."""
        from dslaunch.engine.storage.zero_shards import shard_state_dict

        own = shard_state_dict(strategy)
        own["version"] = strategy.version
        out = {strategy.rank: own}  # (the strategy's rank is still the old world's)
        if self.version is not None and self.ward != strategy.rank:
            out[self.ward] = self._as_state_dict(strategy, own)
        return out

    def _as_state_dict(self, strategy, own: dict) -> dict:
        """The copy in the form of ``own`` (the holder's shard state dict)."""
        from dslaunch.engine.base import partition as P

        copy = iter(self._buffers)
        groups = []
        for g, mine in zip(strategy.groups, own["zero"]["groups"]):
            if _weights_copied(strategy, g):
                master = next(copy).to(mine["master"].dtype, copy=True)
            else:  # fp32: the ward's weights are its chunks of this rank's flat buffer
                master = torch.cat([c.float() for c in P.chunk_views(g.flat, g.layout, self.ward)])
            state: dict = {k: [] for k in mine["state"]}
            for _ in g.shard_params:
                for k in sorted(state):
                    state[k].append(next(copy).reshape(-1))
            groups.append({**mine, "master": master,
                           "state": {k: torch.cat(v) for k, v in state.items()}})
        return {**own, "version": self.version,
                "zero": {**own["zero"], "rank": self.ward, "groups": groups}}


def _wait(works: list) -> bool:
    """Wait for every work; False when a peer was lost (any other error is raised)."""
    from dslaunch.engine.comm.membership import peer_lost

    ok = True
    for work in works:
        try:
            work.wait()
        except RuntimeError as exc:
            if not peer_lost(exc):
                raise
            ok = False
    return ok


def _global(group, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (the world group: itself)."""
    if group is None:
        return rank
    import torch.distributed as dist

    return dist.get_global_rank(group, rank)


def consistent(shards: dict, world: int) -> str | None:
    """Why the gathered ``shards`` ({old rank: state dict}) cannot rebuild a world of ``world``
    ranks' state (None: they can)."""
    missing = [r for r in range(world) if r not in shards]
    if missing:
        return (f"the shards of rank(s) {missing} were lost with their copies (a rank and its "
                "buddy lost together)")
    versions = {r: sd["version"] for r, sd in shards.items()}
    if len(set(versions.values())) != 1:
        return ("the fault came between the ranks' optimizer updates (shard versions "
                f"{versions})")
    return None
