"""Dropless dispatch without padding: every routed token choice travels once, no buffer slot
is empty.

The padded dispatch (``dispatch.encode`` at the busiest expert's count over the group) sends
and computes ``E x max count`` rows per rank; with uneven routing that is far more than the
``k x S`` choices routed. Here instead:

1. the choices are packed by expert, expert 0's first (``k x S`` rows, no gaps), so the slice
   for the experts rank j holds is contiguous;
2. the ranks swap their per-expert counts (a small all-to-all of E integers), so each knows
   how many rows it gets from whom;
3. one all-to-all with those split sizes moves exactly the routed rows (``RaggedAllToAll``: its
   gradient is the same exchange reversed);
4. each local expert runs on exactly its rows (gathered from every source rank), and the
   outputs go back the same way, to be weighted by the gates and summed per token.

Routing decisions are the gate's, unchanged: the same tokens meet the same experts as in the
padded dispatch, so outputs and gradients agree with it (the experts see the same rows, only
without the zero rows between them).
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import Tensor

from dslaunch.engine.comm import api as comm_api


class RaggedAllToAll(torch.autograd.Function):
    """Rows of dim 0 exchanged over ``group`` with uneven splits: ``send_splits[j]`` rows go to
    rank j, ``recv_splits[j]`` come from it (booked in the comm statistics as ``all_to_all``)."""

    @staticmethod
    def forward(ctx, group, input: Tensor, send_splits: List[int], recv_splits: List[int]):
        ctx.group, ctx.send_splits, ctx.recv_splits = group, send_splits, recv_splits
        input = input.contiguous()
        output = input.new_empty((sum(recv_splits),) + tuple(input.shape[1:]))
        comm_api.all_to_all_single(output, input, recv_splits, send_splits, group=group)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad = RaggedAllToAll.apply(ctx.group, grad_output, ctx.recv_splits, ctx.send_splits)
        return None, grad, None, None


def exchange_counts(counts: Tensor, ep_size: int, group) -> Tensor:
    """[E] choices this rank routes to each expert -> [ep_size, E / ep_size]: row i, column l
    is how many rows source rank i sends to this rank's local expert l."""
    send = counts.reshape(ep_size, -1).contiguous()
    if ep_size == 1:
        return send
    recv = torch.empty_like(send)
    comm_api.all_to_all_single(recv, send, group=group)
    return recv


class RaggedDispatch:
    """One forward's routing, packed by expert: ``send(tokens)`` gives each local expert its
    rows, ``combine(outputs, gates)`` brings the expert outputs back to the tokens.

    ``indices`` / ``locations`` [k, S] are the gate's (``-1``: no expert, e.g. an unused
    token); ``locations`` number an expert's choices 0, 1, ... on this rank."""

    def __init__(self, indices: Tensor, locations: Tensor, num_experts: int, ep_size: int,
                 group) -> None:
        self.num_experts, self.ep_size, self.group = num_experts, ep_size, group
        self.num_local = num_experts // ep_size
        flat = indices.reshape(-1).long()
        kept = flat >= 0
        counts = torch.bincount(flat[kept], minlength=num_experts)
        self.rows = int(counts.sum())
        first = torch.cumsum(counts, 0) - counts  # each expert's first row in the packed send
        slots = first[flat.clamp(min=0)] + locations.reshape(-1).long()
        # unrouted choices read the zero row appended after the packed rows
        self.slots = torch.where(kept, slots, torch.full_like(slots, self.rows)).view_as(indices)
        self.order = torch.argsort(self.slots.reshape(-1))[:self.rows]  # packed row -> choice
        self.send_splits = counts.view(ep_size, -1).sum(1).tolist()
        recv = exchange_counts(counts, ep_size, group).cpu()  # [sources, local experts]
        self.recv_splits = recv.sum(1).tolist()
        self.pieces = recv.reshape(-1).tolist()  # received rows by (source, local expert)

    def send(self, tokens: Tensor) -> List[Tensor]:
        """[S, M] tokens -> one [rows_l, M] tensor per local expert: its choices from every
        source rank, source 0's first."""
        packed = tokens.index_select(0, self.order % tokens.shape[0])  # choice j*S + s: token s
        if self.ep_size > 1:
            packed = RaggedAllToAll.apply(self.group, packed, self.send_splits, self.recv_splits)
        if self.num_local == 1:
            return [packed]
        parts = packed.split(self.pieces)
        return [torch.cat(parts[local::self.num_local]) for local in range(self.num_local)]

    def combine(self, outputs: Sequence[Tensor], gates: Tensor) -> Tensor:
        """Per-local-expert outputs (as ``send`` gave them) -> [S, M]: each token's choices
        weighted by their gates (fp32) and summed, in the experts' dtype."""
        if self.num_local == 1:
            packed = outputs[0]
        else:  # back to (source, local expert) order
            by_expert = [out.split(self.pieces[local::self.num_local])
                         for local, out in enumerate(outputs)]
            packed = torch.cat([by_expert[i % self.num_local][i // self.num_local]
                                for i in range(len(self.pieces))])
        if self.ep_size > 1:
            packed = RaggedAllToAll.apply(self.group, packed, self.recv_splits, self.send_splits)
        padded = torch.cat([packed, packed.new_zeros(1, packed.shape[-1])])
        k, s = self.slots.shape
        routed = padded.index_select(0, self.slots.reshape(-1)).view(k, s, -1)
        return (routed * gates.unsqueeze(-1)).sum(0).to(packed.dtype)
