"""DeepSpeed's ``MoE`` layer (``deepspeed.moe.layer.MoE``, 0.19's signature) and the
``MOELayer`` inside it: route the tokens (``gating.TopKGate``), pack them per expert, all-to-all
them to the ranks holding their experts (the ``ep_size_{N}`` expert-parallel group), run the
local experts, all-to-all the results back and combine them by the gate weights. Dropless
gates (``drop_tokens=False``) take the ragged dispatch instead (``ragged.py``): no padding, each
expert runs on exactly its tokens.

Rank r of an expert-parallel group of N holds experts ``r * E/N ... (r + 1) * E/N - 1`` of the
layer's E. Its buffer [E, C, M] is cut along E into N slices, slice j going to rank j, so after
the all-to-all a rank holds [N source ranks, E/N local experts, C, M]: the same tokens meet the
same experts at every ep size, and outputs and gradients agree across ep sizes (the expert
gradients once summed over the expert-data-parallel group, as the engine does).

The groups are made by ``set_deepspeed_parallelism`` (``dslaunch.initialize`` calls it for every
MoE layer of the model, as DeepSpeed's engine does), or at the first forward of a layer that has
none yet (every rank runs the same layers in the same order, so the collective
``new_group`` calls line up). Without torch.distributed an ``ep_size=1`` layer runs alone.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dslaunch.engine.base.log import log_dist
from dslaunch.engine.parallel import expert_groups
from dslaunch.engine.parallel import groups as parallel_groups
from dslaunch.engine.parallel.moe import dispatch
from dslaunch.engine.parallel.moe.experts import Experts
from dslaunch.engine.parallel.moe.gating import TopKGate, route_slots
from dslaunch.engine.parallel.moe.ragged import RaggedDispatch


class MOELayer(nn.Module):
    """Gate + experts + the two all-to-alls. After a forward, ``l_aux`` and ``exp_counts`` hold
    that step's load-balancing loss and per-expert choice counts (DeepSpeed's attributes)."""

    def __init__(self, gate: nn.Module, experts: nn.Module, ep_group_name: str, ep_size: int,
                 num_local_experts: int, use_tutel: bool = False) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.use_tutel = False  # Tutel's kernels are not used: the same dispatch runs instead
        self.wall_clock_breakdown = False
        self.l_aux = None
        self.exp_counts = None
        self.tokens_dropped = None  # fraction of this rank's token choices dropped for capacity
        # dropless gates: send exactly the routed tokens (ragged.py); False: pad every expert's
        # buffer to the busiest expert's count over the group (DeepSpeed's way)
        self.ragged_dropless = True

    def _set_ep_group(self, ep_group) -> None:
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def forward(self, *input: torch.Tensor, **kwargs) -> torch.Tensor:
        hidden = input[0]
        used_token = input[1] if len(input) > 1 else None
        d_model = hidden.shape[-1]
        tokens = hidden.reshape(-1, d_model)
        ragged = self.ragged_dropless and not self.gate.drop_tokens
        routes = self.gate.routes(tokens, used_token, group_capacity=not ragged)
        self.l_aux, self.exp_counts = routes.l_aux, routes.exp_counts
        self.tokens_dropped = (routes.indices < 0).float().mean().detach()
        if ragged:
            plan = RaggedDispatch(routes.indices, routes.locations, routes.num_experts,
                                  self.ep_size, self.ep_group)
            outputs = self.experts.forward_each(plan.send(tokens))
            return plan.combine(outputs, routes.gates).reshape(hidden.shape)
        experts, capacity = routes.num_experts, routes.capacity
        slots = route_slots(routes.indices, routes.locations, experts, capacity)
        buffer = dispatch.encode(tokens, slots, experts, capacity)
        if self.ep_size > 1:
            buffer = dispatch.AllToAll.apply(self.ep_group, buffer)
        # [E, C, M] as [source ranks, local experts, C, M]
        out = self.experts(buffer.reshape(self.ep_size, self.num_local_experts, -1, d_model))
        out = out.reshape(self.ep_size * self.num_local_experts, -1, d_model)
        if self.ep_size > 1:
            out = dispatch.AllToAll.apply(self.ep_group, out)
        combined = dispatch.decode(out.reshape(experts * capacity, d_model), slots, routes.gates)
        return combined.reshape(hidden.shape)


class MoE(nn.Module):
    """A mixture-of-experts layer: ``num_experts`` deep copies of ``expert``, ``num_experts /
    ep_size`` on each rank, routed by a top-``k`` gate. ``use_residual``: Residual MoE (PR-MoE),
    the output mixed with a dense ``expert`` (``self.mlp``) by a learned softmax of two.
    ``forward(hidden_states, used_token=None)`` returns ``(output, l_aux, exp_counts)``.

    Not supported: ``use_tutel`` (accepted, the same dispatch runs) and expert tensor
    parallelism / a tensor-parallel mpu (refused when the groups are made)."""

    def __init__(self, hidden_size: int, expert: nn.Module, num_experts: int = 1,
                 ep_size: int = 1, k: int = 1, capacity_factor: float = 1.0,
                 eval_capacity_factor: float = 1.0, min_capacity: int = 4,
                 use_residual: bool = False, noisy_gate_policy: Optional[str] = None,
                 drop_tokens: bool = True, use_rts: bool = True, use_tutel: bool = False,
                 enable_expert_tensor_parallelism: bool = False,
                 top2_2nd_expert_sampling: bool = True) -> None:
        super().__init__()
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        if num_experts % ep_size:
            raise AssertionError(f"Number of experts ({num_experts}) should be divisible by "
                                 f"expert parallel size ({ep_size})")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise AssertionError(f"Unsupported noisy_gate_policy: {noisy_gate_policy}")
        self.ep_size = ep_size
        self.expert_group_name = expert_groups.group_name(ep_size)
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        log_dist(f"Creating MoE layer with num_experts: {num_experts} | num_local_experts: "
                 f"{self.num_local_experts} | expert_parallel_size: {ep_size}", [0])
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor,
                        min_capacity, noisy_gate_policy, drop_tokens, use_rts, None,
                        top2_2nd_expert_sampling)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size,
                                      self.num_local_experts, use_tutel=use_tutel)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        self._create_process_groups(use_data_before_expert_parallel_)

    def _create_process_groups(self, use_data_before_expert_parallel_: bool = False) -> None:
        if self.deepspeed_moe.ep_group is not None:
            return
        if self.enable_expert_tensor_parallelism or \
                parallel_groups._get_tensor_model_parallel_world_size() > 1:
            raise NotImplementedError("MoE with tensor parallelism (expert tensor parallelism, "
                                      "or a tensor-parallel mpu) is not supported by dslaunch")
        expert_groups._create_expert_and_data_parallel(
            self.ep_size, use_data_before_expert_parallel_=use_data_before_expert_parallel_)
        self.deepspeed_moe._set_ep_group(
            expert_groups._get_expert_parallel_group(self.expert_group_name))

    def expert_ids(self) -> list:
        """The global ids of the experts this rank holds, in ``deepspeed_experts`` order."""
        rank = 0
        if self.ep_size > 1:
            rank = expert_groups._get_expert_parallel_rank(self.expert_group_name)
        return [rank * self.num_local_experts + j for j in range(self.num_local_experts)]

    def forward(self, hidden_states: torch.Tensor, used_token: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.deepspeed_moe.ep_group is None and (self.ep_size > 1 or dist.is_initialized()):
            self._create_process_groups()
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts


def has_moe_layers(m: nn.Module) -> Tuple[bool, int]:
    """(whether ``m`` has an MoE layer, the expert count of the first one)."""
    for module in m.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0
