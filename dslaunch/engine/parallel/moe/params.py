"""Which parameters are experts', and the optimizer parameter groups that keep them apart.

DeepSpeed's contract, kept so its scripts and its engine-side checks read our parameters alike:
an expert parameter has ``allreduce = False`` (it is not reduced over the data-parallel group)
and ``group_name = "ep_size_{N}"`` (the expert-data-parallel group it is reduced over). An
optimizer parameter group with ``moe: True`` holds expert parameters of one ``name`` (that
group name) only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Tuple, Union

import torch
from torch import nn

# DeepSpeed's default cap on the elements of one expert optimizer group
DEFAULT_MAX_GROUP_SIZE = 178956971


def mark_expert_params(module: nn.Module, group_name: str) -> None:
    """Mark ``module``'s parameters as expert parameters of ``group_name``."""
    for param in module.parameters():
        param.allreduce = False
        param.group_name = group_name


def is_moe_param(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_shared_and_expert_params(
        params: List[nn.Parameter]) -> Tuple[List[nn.Parameter], List[nn.Parameter]]:
    shared = [p for p in params if not is_moe_param(p)]
    expert = [p for p in params if is_moe_param(p)]
    return shared, expert


def split_params_grads_into_shared_and_expert_params(
        group: List[nn.Parameter]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The gradients (in each parameter's dtype) of the non-expert and the expert parameters of
    ``group``; parameters without a gradient are left out."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def _numel(param) -> int:
    return param.ds_numel if hasattr(param, "ds_numel") else param.numel()


def _chunks(params: list, max_group_size) -> List[list]:
    """``params`` cut in order into runs of at most ``max_group_size`` elements (a parameter
    larger than that is a run of its own)."""
    runs, run, size = [], [], 0
    for p in params:
        n = _numel(p)
        if run and size + n > max_group_size:
            runs.append(run)
            run, size = [], 0
        run.append(p)
        size += n
    if run:
        runs.append(run)
    return runs


def split_params_into_different_moe_groups_for_optimizer(
        param_groups: Union[Dict[str, Any], Tuple[Dict[str, Any], ...], List[Dict[str, Any]]],
        max_group_size: Union[int, float, None] = DEFAULT_MAX_GROUP_SIZE) -> List[Dict[str, Any]]:
    """``param_groups`` with the expert parameters moved out of each group into new groups, one
    per (original group, expert group name), appended after the originals: a copy of the
    original's options with ``name`` the expert group name and ``moe: True``, cut into several
    of at most ``max_group_size`` elements (None: not cut). Every group needs a ``name``.
    The list (and its dicts) are modified in place, as DeepSpeed does."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")

    names = []  # expert group names in first-seen order
    for group in param_groups:
        for p in group["params"]:
            if is_moe_param(p) and p.group_name not in names:
                names.append(p.group_name)

    moe_groups: Dict[str, Dict[str, Dict[str, Any]]] = defaultdict(dict)
    for group in param_groups:
        for name in names:
            moe_groups[group["name"]][name] = {**group, "name": name, "moe": True, "params": []}
    for group in param_groups:
        kept = []
        for p in group["params"]:
            if is_moe_param(p):
                moe_groups[group["name"]][p.group_name]["params"].append(p)
            else:
                kept.append(p)
        group["params"] = kept

    for by_name in list(moe_groups.values()):
        for group in by_name.values():
            if max_group_size is None:
                param_groups.append(group)
            else:
                for run in _chunks(group["params"], max_group_size):
                    param_groups.append({**group, "params": run})
    return param_groups


def is_moe_param_group(param_group) -> bool:
    return param_group.get("moe", False)


def configure_moe_param_groups(model_parameters: List):
    """The parameter groups DeepSpeed's engine makes of ``model_parameters`` when the model has
    MoE layers: a list of parameters becomes a ``dense-params`` group plus the expert groups;
    a list of groups gets expert groups unless some group already says ``moe``."""
    if not isinstance(model_parameters, list):
        raise AssertionError("model_parameters must be a list")
    for p in model_parameters:
        if not isinstance(p, (torch.Tensor, dict)):
            raise TypeError("param argument that would be given to the optimizer should be an "
                            f"iterable of Tensors or dicts, but got {type(p)}")
    first = model_parameters[0]
    if isinstance(first, nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer(
            {"params": model_parameters, "name": "dense-params"})
    if isinstance(first, dict):
        if not any("moe" in g for g in model_parameters):
            return split_params_into_different_moe_groups_for_optimizer(model_parameters)
        return model_parameters
    return None
