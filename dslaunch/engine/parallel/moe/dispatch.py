"""Moving routed tokens to their experts and back.

``encode`` packs each token choice into its expert's buffer ([E, C, M]; empty slots are zero),
``AllToAll`` sends the buffer slices of the experts another rank holds to that rank (an
autograd function: its gradient is the reverse all-to-all), and ``decode`` gathers the expert
outputs back to the tokens, weighted by their gates, the k choices summed in fp32.
Both copies are index selects, linear in S * k * M.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dslaunch.engine.comm import api as comm_api


class AllToAll(torch.autograd.Function):
    """Equal splits of dim 0 exchanged over ``group`` (booked in the comm statistics)."""

    @staticmethod
    def forward(ctx, group, input: Tensor) -> Tensor:
        ctx.group = group
        input = input.contiguous()
        output = torch.empty_like(input)
        comm_api.all_to_all_single(output, input, group=group)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        return None, AllToAll.apply(ctx.group, grad_output)


def encode(tokens: Tensor, slots: Tensor, num_experts: int, capacity: int) -> Tensor:
    """[S, M] tokens into the [E, C, M] buffer: choice (j, s) lands at flat slot ``slots[j, s]``
    (the spare slot E * C takes every dropped choice and is cut off)."""
    k, s = slots.shape
    buffer = tokens.new_zeros(num_experts * capacity + 1, tokens.shape[1])
    buffer = buffer.index_copy(0, slots.reshape(-1), tokens.repeat(k, 1))
    return buffer[:-1].view(num_experts, capacity, tokens.shape[1])


def decode(expert_output: Tensor, slots: Tensor, gates: Tensor) -> Tensor:
    """[E * C, M] expert outputs back to [S, M]: each token's choices weighted by their gates
    (fp32) and summed, in the experts' dtype."""
    k, s = slots.shape
    padded = torch.cat([expert_output, expert_output.new_zeros(1, expert_output.shape[-1])])
    routed = padded.index_select(0, slots.reshape(-1)).view(k, s, -1)
    return (routed * gates.unsqueeze(-1)).sum(0).to(expert_output.dtype)
