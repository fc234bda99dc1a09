"""The experts one rank holds: deep copies of the given expert module, their parameters marked
as expert parameters of their ep-size group (``params.mark_expert_params``). DeepSpeed's class
and attribute names (``deepspeed_experts``), so state_dict keys match its checkpoints'."""

from __future__ import annotations

import copy
from typing import List, Optional

import torch
from torch import nn

from dslaunch.engine.parallel.moe.params import mark_expert_params


class Experts(nn.Module):

    def __init__(self, expert: nn.Module, num_local_experts: int = 1,
                 expert_group_name: Optional[str] = None) -> None:
        super().__init__()
        self.deepspeed_experts = nn.ModuleList([copy.deepcopy(expert)
                                                for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for e in self.deepspeed_experts:
            mark_expert_params(e, expert_group_name)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` [ranks, local experts, C, M]: local expert j takes column j."""
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1),
                                 self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)  # (out, bias): out
        return torch.cat(outputs, dim=1)

    def forward_each(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """Local expert j on ``inputs[j]`` (its rows, any count, none included: an expert
        without tokens still runs, so its parameters get a (zero) gradient every step)."""
        outputs = []
        for rows, expert in zip(inputs, self.deepspeed_experts):
            out = expert(rows)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return outputs
