"""CPU offload of the optimizer step.

With ``offload_optimizer: {device: cpu}`` the strategies keep the fp32 master shard, the fp32
gradient shard and the optimizer states on the CPU, so the step runs there. As DeepSpeed swaps in
DeepSpeedCPUAdam, a torch Adam/AdamW is replaced by dslaunch's compiled CPU Adam
(``engine/optim/cpu_adam.py``, same hyperparameters, same arithmetic to float rounding) when its
op is built; otherwise the user's torch optimizer steps the CPU shards itself.
"""

from __future__ import annotations

import torch


def cpu_optimizer_for(optimizer, shard_groups: list, fp32_optimizer_states: bool = True):
    """A DSCPUAdam over ``shard_groups`` (one parameter list per optimizer group), or None.
    ``fp32_optimizer_states=False``: states in the shards' dtype (bf16.bf16_optimizer_states)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    if any(pg.get("amsgrad") or pg.get("maximize") for pg in optimizer.param_groups):
        return None
    try:
        from dslaunch.engine.optim.cpu_adam import DSCPUAdam
    except ImportError:
        return None
    groups = [{"params": list(params), "lr": float(pg["lr"]), "betas": tuple(pg["betas"]),
               "eps": pg["eps"], "weight_decay": pg["weight_decay"]}
              for pg, params in zip(optimizer.param_groups, shard_groups)]
    try:
        new = DSCPUAdam(groups, adamw_mode=type(optimizer) is torch.optim.AdamW,
                        fp32_optimizer_states=fp32_optimizer_states)
    except Exception:  # the op could not be loaded: keep the torch optimizer
        return None
    return new if new.compiled else None
