"""Copies of a neighbour's ZeRO 1-2 shard, so that a lost rank's optimizer state survives it
(in-process recovery, ``engine/inprocess_recovery.py``).

At ZeRO 1-2 every rank holds the whole model but only its own shard of the fp32 masters and the
optimizer states: when a rank dies, its shard exists nowhere else, and no survivor can hand it to
a replacement. With ``dslaunch run --recover in-process`` each rank therefore keeps a copy of one
other rank's shard (its *ward*), refreshed by a point-to-point exchange after every optimizer
update: rank ``r`` sends its shard to its *buddy* and receives its ward's. The buddy is the same
local rank on the next host when the job spans several hosts (a lost host takes its ranks' copies
with it otherwise), else the next rank.

Cost, per rank and per optimizer step: one shard of state sent and one received (for Adam in fp32:
2 x 4 bytes x parameters / world; with fp32 masters beside bf16 weights, 3 x), and that much more
host memory for the copy.

A shard's ``version`` counts the updates applied to it (and loads): a recovery rebuilds state only
from shards that all carry one version (``consistent``), otherwise it refuses and the job restarts.
"""

from __future__ import annotations

import os

import torch


def buddy_of(rank: int, world: int, per_host: int) -> int:
    """Whom ``rank`` sends its shard to."""
    step = per_host if 1 <= per_host < world and world % per_host == 0 else 1
    return (rank + step) % world


def ward_of(rank: int, world: int, per_host: int) -> int:
    """Whose shard ``rank`` keeps a copy of (the rank whose buddy it is)."""
    step = per_host if 1 <= per_host < world and world % per_host == 0 else 1
    return (rank - step) % world


def _ranks_per_host() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)


def _tensors(sd: dict) -> list:
    """The tensors of a shard state dict (``checkpoint/zero_shards.shard_state_dict``), in an
    order every rank agrees on."""
    out = []
    for g in sd["zero"]["groups"]:
        out.append(g["master"])
        out += [g["state"][k] for k in sorted(g["state"])]
        out += [g["scalars"][k] for k in sorted(g["scalars"])]
    return out


def _blank_like(sd: dict) -> dict:
    """``sd`` with every tensor replaced by an empty one of its shape (a receive buffer)."""
    groups = [{**g, "master": torch.empty_like(g["master"]),
               "state": {k: torch.empty_like(v) for k, v in g["state"].items()},
               "scalars": {k: torch.empty_like(v) for k, v in g["scalars"].items()}}
              for g in sd["zero"]["groups"]]
    return {**sd, "zero": {**sd["zero"], "groups": groups}}


class ShardCopies:
    """This rank's copy of its ward's shard, and the exchange that refreshes it."""

    def __init__(self):
        self.ward: int | None = None  # the ward's rank when the copy was taken
        self.copy: dict | None = None  # its shard state dict, with ``version``

    def exchange(self, strategy) -> None:
        """Send this rank's shard to its buddy and take its ward's (every rank of the strategy's
        group calls this together). A peer lost during the exchange leaves the copy as it was
        if nothing new arrived; the error is kept for the collective that follows, which fails
        the same way and starts the recovery."""
        import torch.distributed as dist

        world, rank = strategy.comm.world_size, strategy.comm.rank
        if world < 2:
            self.ward = self.copy = None
            return
        from dslaunch.engine.checkpoint.zero_shards import shard_state_dict

        mine = shard_state_dict(strategy)
        mine["version"] = strategy.version
        per_host = _ranks_per_host()
        buddy, ward = buddy_of(rank, world, per_host), ward_of(rank, world, per_host)
        incoming = _blank_like(mine)
        group = strategy.comm.group
        # versions first: a shard's tensors and its version always travel together
        version = torch.tensor([strategy.version], dtype=torch.int64)
        theirs = torch.empty(1, dtype=torch.int64)
        sends = [dist.isend(t.contiguous(), _global(group, buddy), group=group)
                 for t in [version] + _tensors(mine)]
        recvs = [dist.irecv(t, _global(group, ward), group=group)
                 for t in [theirs] + _tensors(incoming)]
        try:
            for work in recvs:
                work.wait()
        except RuntimeError as exc:
            from dslaunch.engine.inprocess_recovery import comm_fault

            if not comm_fault(exc):
                raise
            return  # the ward is gone: its last copy stands (its version tells how old)
        incoming["version"] = int(theirs.item())
        incoming["zero"]["rank"] = ward
        self.ward, self.copy = ward, incoming
        for work in sends:
            try:
                work.wait()
            except RuntimeError as exc:
                from dslaunch.engine.inprocess_recovery import comm_fault

                if not comm_fault(exc):
                    raise

    def held(self, strategy) -> dict:
        """{rank in the old world: its shard state dict with ``version``}: this rank's own shard
        and its copy of its ward's."""
        from dslaunch.engine.checkpoint.zero_shards import shard_state_dict

        own = shard_state_dict(strategy)
        own["version"] = strategy.version
        out = {strategy.rank: own}  # (the strategy's rank is still the old world's)
        if self.copy is not None:
            out.setdefault(self.ward, self.copy)
        return out


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
