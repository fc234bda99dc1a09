"""``dslaunch.zero``: DeepSpeed's ``deepspeed.zero.Init`` and ``GatheredParameters``, by name.

This build partitions parameters only under ZeRO stage 3, which is not available yet; under stages
0-2 every rank holds whole parameters, so:

- ``Init(...)`` accepts DeepSpeed's arguments and builds the model normally (no partitioning at
  construction). Scripts written for DeepSpeed run unchanged; they just materialise the model.
- ``GatheredParameters(params, modifier_rank=None)`` gives the (already whole) parameters; with
  ``modifier_rank=r`` the values rank r holds when the block ends are broadcast to every rank, and
  the fp32 master copies of any ZeRO 1-2 strategy owning those parameters are refreshed, so a
  modification survives the next optimizer step (DeepSpeed's contract).
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist

_STRATEGIES: "weakref.WeakSet" = weakref.WeakSet()


def register_strategy(strategy) -> None:
    """Strategies with fp32 masters register here so GatheredParameters can refresh them."""
    _STRATEGIES.add(strategy)


class Init(contextlib.ContextDecorator):
    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None, **kwargs):
        self.enabled = enabled
        self.dtype = dtype

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _as_list(params):
    if isinstance(params, torch.Tensor):
        return [params]
    return [p for p in params if isinstance(p, torch.Tensor)]


class GatheredParameters(contextlib.ContextDecorator):
    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.params = _as_list(params) if params is not None else []
        self.modifier_rank = modifier_rank
        self.enabled = enabled

    def __enter__(self):
        return self.params

    def __exit__(self, *exc):
        if not self.enabled or self.modifier_rank is None or exc[0] is not None:
            return False
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            with torch.no_grad():
                for p in self.params:
                    dist.broadcast(p.data, src=self.modifier_rank)
        ids = {id(p) for p in self.params}
        for strategy in list(_STRATEGIES):
            owned = getattr(strategy, "owns", None)
            if owned is not None and owned(ids):
                strategy.sync_from_model()
        return False
