"""Pieces the ZeRO 1-3 strategies share: config reading, the shard optimizer (the user's
optimizer re-pointed at this rank's shard parameters), parameter names. (Loss scale and clipping:
``engine/step_policy.py``.)"""

from __future__ import annotations

from collections import defaultdict

import torch


def cfg_get(cfg, path: str, default=None):
    """Dotted lookup in a ResolvedConfig (``.get(path)``) or a plain nested dict."""
    if cfg is None:
        return default
    if not isinstance(cfg, dict):
        getter = getattr(cfg, "get", None)
        if callable(getter):
            try:
                value = getter(path)
            except (KeyError, AttributeError, TypeError):
                value = None
            return default if value is None else value
        cfg = getattr(cfg, "values", {}) or {}
    node = cfg
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return default if node is None else node


class ZeroOptions:
    """The ``zero_optimization`` keys the strategies read, with DeepSpeed's defaults."""

    def __init__(self, cfg, stage: int):
        g = lambda key, default: cfg_get(cfg, f"zero_optimization.{key}", default)  # noqa: E731
        self.stage = stage
        self.reduce_bucket_size = int(g("reduce_bucket_size", int(5e8)))
        self.allgather_bucket_size = int(g("allgather_bucket_size", int(5e8)))
        self.contiguous_gradients = bool(g("contiguous_gradients", True))
        overlap = g("overlap_comm", None)
        self.overlap_comm = (stage == 3) if overlap is None else bool(overlap)
        off_opt = g("offload_optimizer.device", "none")
        if g("cpu_offload", False):
            off_opt = "cpu"
        # nvme runs the cpu path; zero/nvme_swap.py then moves the optimizer states to files
        self.offload_optimizer = off_opt in ("cpu", "nvme")
        off_par = g("offload_param.device", "none")
        if g("cpu_offload_param", False):
            off_par = "cpu"
        self.offload_param = off_par == "cpu"
        self.pin_memory = bool(g("offload_optimizer.pin_memory", False) or
                               g("cpu_offload_use_pin_memory", False))
        self.prefetch_bucket_size = int(g("stage3_prefetch_bucket_size", int(5e7)))
        self.param_persistence_threshold = int(g("stage3_param_persistence_threshold", int(1e5)))
        self.max_live_parameters = int(g("stage3_max_live_parameters", int(1e9)))
        self.max_reuse_distance = int(g("stage3_max_reuse_distance", int(1e9)))
        self.gather_16bit_weights_on_model_save = bool(
            g("stage3_gather_16bit_weights_on_model_save", False))


def get_comm(comm):
    """The engine's accounting ``Comm`` (engine/comm.py), or one over the world group."""
    if comm is not None:
        return comm
    from dslaunch.engine.comm import Comm

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
