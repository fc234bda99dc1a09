"""Pieces the ZeRO 1-3 strategies share: the offload choice, the shard optimizer (the user's
optimizer re-pointed at this rank's shard parameters), parameter names. (Loss scale and clipping:
``engine/base/step_policy.py``.)"""

from __future__ import annotations

from collections import defaultdict

import torch


def offloads_optimizer(zero) -> bool:
    """The optimizer step runs on the CPU: ``offload_optimizer`` to cpu, or to nvme (which runs
    the cpu path; ``nvme/optimizer.py`` then moves the optimizer states to files)."""
    return zero.offload_optimizer.device in ("cpu", "nvme")


class BufferPool:
    """Reusable 1-D buffers: ``take(numel, make)`` hands out a view of the smallest pooled buffer
    that is big enough (or ``make(numel)``'s new one), ``give(t)`` takes it back. The pool holds
    whole buffers: pooling the views instead let it grow by a buffer every step (seen as RSS
    creeping up)."""

    def __init__(self):
        self.free: list = []

    def take(self, numel: int, make) -> torch.Tensor:
        fits = [i for i, buf in enumerate(self.free) if buf.numel() >= numel]
        if fits:
            i = min(fits, key=lambda j: self.free[j].numel())
            return self.free.pop(i)[:numel]
        return make(numel)

    def give(self, t: torch.Tensor) -> None:
        self.free.append(t if t._base is None else t._base)


def get_comm(comm):
    """The engine's accounting ``Comm`` (engine/comm/collectives.py), or one over the world group."""
    if comm is not None:
        return comm
    from dslaunch.engine.comm.collectives import Comm

    return Comm()


# -- the user's optimizer, re-pointed at shards -----------------------------------------------------

def repoint_optimizer(optimizer: torch.optim.Optimizer, shard_params_per_group: list) -> None:
    """Keep the user's optimizer object (so LR schedulers and user code that holds it keep
    working), but make each group step this rank's shard parameters instead of the full ones."""
    if len(shard_params_per_group) != len(optimizer.param_groups):
        raise ValueError("one list of shard parameters per optimizer param group is needed")
    for group, params in zip(optimizer.param_groups, shard_params_per_group):
        group["params"] = list(params)
    optimizer.state = defaultdict(dict)


def named_groups(model: torch.nn.Module, optimizer) -> list:
    """[[(name, param), ...] per optimizer group], trainable params only, names from the model."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for gi, group in enumerate(optimizer.param_groups):
        named = []
        for p in group["params"]:
            if not p.requires_grad:
                continue
            if id(p) not in names:
                raise ValueError(f"optimizer param group {gi} holds a tensor that is not a "
                                 "parameter of the model")
            named.append((names[id(p)], p))
        groups.append(named)
    return groups
