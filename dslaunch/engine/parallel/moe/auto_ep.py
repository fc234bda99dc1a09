"""AutoEP: expert parallelism for Hugging Face MoE models without touching their code (the
``expert_parallel`` config section: ``enabled``, ``autoep_size``, ``preset_model``).

Transformers' MoE blocks (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, ...) have one shape: a router
(``block.gate``) that returns each token's top-k expert ids and weights, and an experts module
(``block.experts``) holding every expert's weights as two 3-D parameters, ``gate_up_proj``
[E, 2I, H] and ``down_proj`` [E, H, I], called as ``experts(hidden, top_k_index,
top_k_weights)``. AutoEP keeps the router (its routing, score function, bias correction, group
limits and scaling stay the model's own) and any shared experts, and replaces the experts module
by ``ExpertParallelExperts``: this rank's ``E / autoep_size`` experts' slices of the same two
parameters, the tokens sent to them by all-to-all over the ``ep_size_{autoep_size}`` group and
back, dropless (``ragged.py``: exactly the routed tokens, each expert on its own rows). Expert
parameters are marked as DeepSpeed's expert parameters (``allreduce = False``, ``group_name``),
so the engine reduces them over the expert-data-parallel group and never ZeRO-partitions them
with the dense ones.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from dslaunch.engine.parallel import expert_groups
from dslaunch.engine.parallel.moe.params import mark_expert_params
from dslaunch.engine.parallel.moe.ragged import RaggedDispatch

# preset_model -> the class-name prefix of its blocks' experts modules (None: any that fits)
PRESETS = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe",
           "qwen3_5_moe": "Qwen3_5Moe", "deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3"}


def _is_fused_experts(module: nn.Module) -> bool:
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gu, nn.Parameter) and isinstance(down, nn.Parameter) and gu.dim() == 3
            and down.dim() == 3 and hasattr(module, "act_fn"))


def find_expert_modules(model: nn.Module, preset_model: Optional[str] = None) -> list:
    """(parent block, attribute name, experts module) of every MoE block's experts: a module
    with 3-D ``gate_up_proj`` / ``down_proj`` whose block also has a ``gate`` router."""
    if preset_model is not None and preset_model not in PRESETS:
        raise ValueError(f"Unknown preset_model {preset_model!r}; available: {sorted(PRESETS)}")
    prefix = PRESETS.get(preset_model)
    found = []
    for block in model.modules():
        experts = getattr(block, "experts", None)
        if (isinstance(experts, nn.Module) and _is_fused_experts(experts)
                and hasattr(block, "gate")
                and (prefix is None or type(experts).__name__.startswith(prefix))):
            found.append((block, "experts", experts))
    return found


class ExpertParallelExperts(nn.Module):
    """This rank's experts of a fused experts module, ``forward(hidden [T, H], top_k_index
    [T, k], top_k_weights [T, k]) -> [T, H]`` as the module it replaces."""

    def __init__(self, experts: nn.Module, ep_size: int):
        super().__init__()
        self.num_experts = int(experts.gate_up_proj.shape[0])
        if self.num_experts % ep_size:
            raise ValueError(f"{self.num_experts} experts cannot be split over autoep_size "
                             f"{ep_size}")
        self.ep_size = ep_size
        self.num_local_experts = self.num_experts // ep_size
        self.group_name = expert_groups.group_name(ep_size)
        self.act_fn = experts.act_fn
        expert_groups._create_expert_and_data_parallel(ep_size)
        self.ep_group = expert_groups._get_expert_parallel_group(self.group_name)
        rank = expert_groups._get_expert_parallel_rank(self.group_name) if ep_size > 1 else 0
        self.first_expert = rank * self.num_local_experts
        local = slice(self.first_expert, self.first_expert + self.num_local_experts)
        with torch.no_grad():
            self.gate_up_proj = nn.Parameter(experts.gate_up_proj[local].clone(),
                                             requires_grad=experts.gate_up_proj.requires_grad)
            self.down_proj = nn.Parameter(experts.down_proj[local].clone(),
                                          requires_grad=experts.down_proj.requires_grad)
        mark_expert_params(self, self.group_name)

    def expert_ids(self) -> list:
        return list(range(self.first_expert, self.first_expert + self.num_local_experts))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        e = self.num_experts
        # choices as [k, T]; an id outside the experts (a model's "no expert") is dropped
        indices = top_k_index.t().long()
        indices = torch.where(indices < e, indices, torch.full_like(indices, -1))
        onehot = torch.nn.functional.one_hot(indices.clamp(min=0).reshape(-1), e)
        onehot = onehot * (indices.reshape(-1, 1) >= 0)
        locations = ((torch.cumsum(onehot, 0) - 1) * onehot).sum(1).view_as(indices)
        plan = RaggedDispatch(indices, locations, e, self.ep_size, self.ep_group)
        outputs = []
        for local, rows in enumerate(plan.send(hidden_states)):  # exactly its tokens
            gate, up = (rows @ self.gate_up_proj[local].t()).chunk(2, dim=-1)
            outputs.append((self.act_fn(gate) * up) @ self.down_proj[local].t())
        weights = torch.where(indices >= 0, top_k_weights.t().float(),
                              torch.zeros_like(top_k_weights.t().float()))
        return plan.combine(outputs, weights).to(hidden_states.dtype)


def apply_autoep(model: nn.Module, autoep_size: int = 1,
                 preset_model: Optional[str] = None) -> int:
    """Replace every MoE block's experts of ``model`` (in place) by ``ExpertParallelExperts`` over
    ``autoep_size`` ranks; returns how many were replaced. Every rank must hold the same full
    weights (the same seed or checkpoint) and call this alike (it makes the groups)."""
    if not dist.is_initialized():
        raise RuntimeError("AutoEP needs torch.distributed initialised")
    if dist.get_world_size() % autoep_size:
        raise ValueError(f"autoep_size {autoep_size} does not divide the world size "
                         f"{dist.get_world_size()}")
    found = find_expert_modules(model, preset_model)
    if not found:
        raise ValueError("expert_parallel: no MoE block (a router `gate` beside fused experts "
                         "`gate_up_proj` / `down_proj`) found in the model"
                         + (f" for preset_model {preset_model!r}" if preset_model else ""))
    for block, attr, experts in found:
        setattr(block, attr, ExpertParallelExperts(experts, autoep_size))
    return len(found)


def _swap(params, swapped: dict):
    """``params`` (parameters, or optimizer param-group dicts) with each replaced parameter
    dropped and the replacing ones added once, where the first replaced one stood."""
    if params is None:
        return None
    params = list(params)
    if params and isinstance(params[0], dict):
        return [{**g, "params": _swap(g["params"], swapped)} for g in params]
    out, added = [], set()
    for p in params:
        new = swapped.get(id(p))
        if new is None:
            out.append(p)
        else:
            for q in new:
                if id(q) not in added:
                    added.add(id(q))
                    out.append(q)
    return out


def autoep_from_config(model: nn.Module, section, model_parameters=None):
    """``dslaunch.initialize``'s AutoEP step: apply the ``expert_parallel`` section (typed, with
    ``enabled``, ``autoep_size``, ``preset_model``) to ``model`` and return ``model_parameters``
    with the replaced expert weights swapped for the new ones (None stays None)."""
    if not section.enabled:
        return model_parameters
    before = {name: p for name, p in model.named_parameters()}
    apply_autoep(model, section.autoep_size, section.preset_model)
    after = dict(model.named_parameters())
    swapped = {id(p): [after[name]] for name, p in before.items()
               if name in after and after[name] is not p}
    return _swap(model_parameters, swapped)
