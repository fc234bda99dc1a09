"""Flat, bucketed, partitioned layout of a parameter group, shared by ZeRO stages 1-3.

A group's parameters are packed (in reverse registration order, the order their gradients become
ready in backward) into buckets of about ``bucket_numel`` elements. Each bucket is padded to a
multiple of the data-parallel size N and split into N equal chunks: rank r owns chunk r of every
bucket. So a bucket's gradients are reduced with one ``reduce_scatter_tensor`` (each rank gets
exactly the chunk it owns) and its parameters rebuilt with one ``all_gather_into_tensor``; both
are native in gloo and NCCL. A parameter never straddles two buckets (a parameter larger than the
bucket size gets a bucket of its own), but does straddle chunks, i.e. ranks.

``Layout`` is pure bookkeeping (names, shapes, offsets) and its ``meta()`` is what a checkpoint
stores to describe the partitioning, so a checkpoint written by N ranks can be read by M.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Slot:
    """One parameter inside a bucket: elements [start, start + numel) of the bucket."""

    name: str
    shape: tuple
    start: int
    numel: int


@dataclass
class Bucket:
    offset: int  # first element of the bucket in the group's flat buffer
    numel: int  # padded: a multiple of the world size
    slots: list = field(default_factory=list)

    def chunk(self, world_size: int) -> int:
        return self.numel // world_size


def _pad(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class Layout:
    world_size: int
    buckets: list

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    @property
    def shard_numel(self) -> int:
        return self.numel // self.world_size

    @property
    def unpadded_numel(self) -> int:
        return sum(s.numel for b in self.buckets for s in b.slots)

    def meta(self) -> dict:
        return {"world_size": self.world_size,
                "buckets": [{"numel": b.numel,
                             "params": [[s.name, list(s.shape), s.start, s.numel] for s in b.slots]}
                            for b in self.buckets]}

    @classmethod
    def from_meta(cls, meta: dict) -> "Layout":
        buckets, offset = [], 0
        for b in meta["buckets"]:
            slots = [Slot(name, tuple(shape), start, numel) for name, shape, start, numel in b["params"]]
            buckets.append(Bucket(offset, b["numel"], slots))
            offset += b["numel"]
        return cls(meta["world_size"], buckets)

    def shard_pieces(self, rank: int):
        """For rank ``rank``: (bucket index, slot, lo, hi, shard_pos) for every piece of a parameter
        the rank owns; elements [lo, hi) of the flattened parameter sit at ``shard_pos`` in the
        rank's shard (its chunks of every bucket, concatenated)."""
        pos = 0
        for bi, b in enumerate(self.buckets):
            c = b.chunk(self.world_size)
            c_lo, c_hi = rank * c, (rank + 1) * c
            for s in b.slots:
                lo, hi = max(s.start, c_lo), min(s.start + s.numel, c_hi)
                if lo < hi:
                    yield bi, s, lo - s.start, hi - s.start, pos + lo - c_lo
            pos += c

    def shard_offsets(self) -> list:
        """Start of each bucket's chunk inside a rank's shard."""
        out, pos = [], 0
        for b in self.buckets:
            out.append(pos)
            pos += b.chunk(self.world_size)
        return out


def build_layout(named_params, world_size: int, bucket_numel: int, kind=None) -> Layout:
    """``named_params``: [(name, param)] in registration order. ``kind(param)``: parameters of
    different kinds never share a bucket (autocast: gradients reduced in different dtypes)."""
    bucket_numel = max(int(bucket_numel), 1)
    buckets, cur, used = [], [], 0
    cur_kind = None

    def close():
        nonlocal cur, used
        if cur:
            offset = sum(b.numel for b in buckets)
            buckets.append(Bucket(offset, _pad(used, world_size), cur))
        cur, used = [], 0

    for name, p in reversed(list(named_params)):
        n = p.numel()
        k = kind(p) if kind is not None else None
        if cur and (used + n > bucket_numel or k != cur_kind):
            close()
        cur_kind = k
        cur.append(Slot(name, tuple(p.shape), used, n))
        used += n
    close()
    return Layout(world_size, buckets)


def flatten_into(layout: Layout, params_by_name: dict, dtype, device) -> torch.Tensor:
    """Copy the parameters into one padded flat buffer and make each parameter a view of it."""
    flat = torch.zeros(layout.numel, dtype=dtype, device=device)
    for b in layout.buckets:
        for s in b.slots:
            p = params_by_name[s.name]
            view = flat[b.offset + s.start: b.offset + s.start + s.numel].view(s.shape)
            view.copy_(p.detach())
            p.data = view
    return flat


def bucket_views(flat: torch.Tensor, layout: Layout) -> list:
    return [flat[b.offset: b.offset + b.numel] for b in layout.buckets]


def chunk_views(flat: torch.Tensor, layout: Layout, rank: int) -> list:
    """This rank's chunk of each bucket, as views of the flat buffer."""
    out = []
    for b in layout.buckets:
        c = b.chunk(layout.world_size)
        out.append(flat[b.offset + rank * c: b.offset + (rank + 1) * c])
    return out


def shard_chunks(shard: torch.Tensor, layout: Layout) -> list:
    """A rank's contiguous shard split into its per-bucket chunks (views)."""
    return list(shard.split([b.chunk(layout.world_size) for b in layout.buckets]))
