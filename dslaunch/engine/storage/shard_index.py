"""Reading a partitioned (ZeRO 1-3) checkpoint by parameter, whatever the world size it was saved
with: the range arithmetic behind consolidation, offline reshaping and resharding on load.

A rank's shard is its chunk of every bucket, concatenated (``partition.py``). Elements
[lo, hi) of parameter ``name`` sit in bucket b at [start+lo, start+hi); rank k owns elements
[k*c, (k+1)*c) of the bucket (c = bucket numel / world), at ``shard_offsets[b]`` in its shard.
"""

from __future__ import annotations

import torch

from dslaunch.engine.base.partition import Layout


class ParamIndex:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.offsets = layout.shard_offsets()
        self.where = {s.name: (bi, s) for bi, b in enumerate(layout.buckets) for s in b.slots}

    def names(self):
        return [s.name for b in self.layout.buckets for s in b.slots]

    def gather(self, shards, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of the flattened parameter, read from ``shards`` (rank -> 1-D tensor,
        a list or a callable)."""
        bi, s = self.where[name]
        hi = s.numel if hi is None else hi
        c = self.layout.buckets[bi].chunk(self.layout.world_size)
        a, z = s.start + lo, s.start + hi
        parts = []
        for k in range(a // c, (z - 1) // c + 1):
            shard = shards(k) if callable(shards) else shards[k]
            x0, x1 = max(a, k * c), min(z, (k + 1) * c)
            base = self.offsets[bi] - k * c
            parts.append(shard[base + x0: base + x1])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def reshard(new_layout: Layout, rank: int, old: ParamIndex, shards, dtype=torch.float32):
    """This rank's shard under ``new_layout``, filled from another layout's shards."""
    out = torch.zeros(new_layout.shard_numel, dtype=dtype)
    for _, s, lo, hi, pos in new_layout.shard_pieces(rank):
        if s.name not in old.where:
            raise KeyError(f"parameter {s.name!r} is not in the checkpoint")
        out[pos: pos + hi - lo].copy_(old.gather(shards, s.name, lo, hi))
    return out


def relayout(layout: Layout, world_size: int) -> Layout:
    """The same buckets (same parameters in each) padded and chunked for another world size:
    what a job with ``world_size`` ranks and the same bucket size builds."""
    meta = layout.meta()
    for b in meta["buckets"]:
        used = sum(p[3] for p in b["params"])
        b["numel"] = -(-used // world_size) * world_size
    meta["world_size"] = world_size
    return Layout.from_meta(meta)


def param_locations(z0: dict) -> dict:
    """name -> (ParamIndex, group index) of every parameter in a ZeRO 1-3 rank file's groups."""
    where = {}
    for gi, g in enumerate(z0["groups"]):
        idx = ParamIndex(Layout.from_meta(g["layout"]))
        for name in idx.names():
            where[name] = (idx, gi)
    return where


def gather_master(files, where: dict, name: str, rank_of=lambda k: k):
    """Parameter ``name``'s flat fp32 master, from the shards of data-parallel ranks 0..dp-1 in
    ``files`` (a ``files.RankFiles``; ``rank_of(k)``: the global rank whose file holds
    data-parallel rank k's shard)."""
    idx, gi = where[name]
    return idx.gather(lambda k: files.zero(rank_of(k))["groups"][gi]["master"], name)
