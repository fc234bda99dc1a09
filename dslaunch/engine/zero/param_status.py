"""DeepSpeed's ZeRO-3 parameter attributes, kept true by stage 3 and by ``zero.Init``.

Code written for DeepSpeed reads them on partitioned parameters: ``ds_status`` against
``ZeroParamStatus`` to decide what needs gathering (TRL, OpenRLHF, DeepSpeed-Chat), ``ds_id`` to
tell a ZeRO-3 parameter, ``ds_numel`` / ``partition_numel()`` to count (Lightning's model summary),
``ds_shape`` for the whole shape, ``ds_tensor`` for this rank's elements.

- ``ds_shape``, ``ds_numel``: the whole parameter (ours keep their shape when released, too).
- ``ds_tensor``: the elements of the parameter this rank holds, a view of its shard (stage 3 cuts
  buckets, not parameters, into chunks: a parameter that lies wholly in other ranks' chunks has an
  empty one here); ``partition_numel()`` is its size.
- ``ds_status`` follows the bucket the parameter lives in: stage 3 replaces ``ParamStore.state``
  with a ``StatusBoard``, which writes the new status into the bucket's parameters whenever the
  store gathers, starts gathering or releases it (so the store itself knows nothing about it).
"""

from __future__ import annotations

import enum
import itertools

import torch

from dslaunch.engine.zero.stage3_fetch import GATHERED, IN_FLIGHT, RELEASED


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1  # whole on this rank
    NOT_AVAILABLE = 2  # partitioned: this rank holds only its shard
    INFLIGHT = 3  # being gathered


_STATUS_OF_STORE_STATE = {RELEASED: ZeroParamStatus.NOT_AVAILABLE,
                          IN_FLIGHT: ZeroParamStatus.INFLIGHT,
                          GATHERED: ZeroParamStatus.AVAILABLE}
_next_id = itertools.count()  # one numbering for every engine of the process, as DeepSpeed's


class PartitionNumel:
    """``param.partition_numel()``: a picklable callable (a lambda would make the parameter
    impossible to pickle)."""

    __slots__ = ("numel",)

    def __init__(self, numel: int):
        self.numel = numel

    def __call__(self) -> int:
        return self.numel


def set_ds_attributes(p: torch.nn.Parameter, shard: torch.Tensor,
                      status: ZeroParamStatus) -> None:
    """Mark ``p`` as a ZeRO-3 parameter whose elements here are ``shard``."""
    if not hasattr(p, "ds_id"):
        p.ds_id = next(_next_id)
    p.ds_shape = torch.Size(p.shape)
    p.ds_numel = p.numel()
    p.ds_tensor = shard
    p.partition_numel = PartitionNumel(shard.numel())
    p.ds_status = status


class StatusBoard(dict):
    """``ParamStore.state`` (bucket key -> gathered / in flight / released) that also writes each
    change into the ``ds_status`` of the bucket's parameters."""

    def __init__(self, states: dict, params_of: dict):
        super().__init__(states)
        self.params_of = params_of

    def __setitem__(self, key, state) -> None:
        super().__setitem__(key, state)
        status = _STATUS_OF_STORE_STATE[state]
        for p in self.params_of.get(key, ()):
            p.ds_status = status


def attach_ds_attributes(strategy) -> None:
    """Give every parameter a stage-3 strategy partitions its ``ds_*`` attributes, and make the
    strategy's store keep ``ds_status`` true from now on."""
    store, world, rank = strategy.store, strategy.world, strategy.rank
    params_of: dict = {}
    for gi, g in enumerate(strategy.groups):
        chunks = store.chunk_views(gi)
        for bi, bucket in enumerate(g.layout.buckets):
            c = bucket.chunk(world)
            mine_lo, mine_hi = rank * c, (rank + 1) * c
            status = _STATUS_OF_STORE_STATE[store.state[(gi, bi)]]
            for s in bucket.slots:
                p = g.params[s.name]
                lo, hi = max(s.start, mine_lo), min(s.start + s.numel, mine_hi)
                shard = chunks[bi][lo - mine_lo: hi - mine_lo] if lo < hi else chunks[bi][:0]
                set_ds_attributes(p, shard, status)
                params_of.setdefault((gi, bi), []).append(p)
    store.state = StatusBoard(store.state, params_of)
