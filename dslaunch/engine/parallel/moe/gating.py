"""Token routing: DeepSpeed's top-1, top-2 and top-k gates, decision for decision.

Every gate takes the router logits of S tokens over E experts (fp32) and returns ``Routes``: for
each of its k choices per token, the expert (``-1`` when the token was dropped for capacity), the
token's slot in that expert's buffer and its combine weight, plus the load-balancing loss
``l_aux``, the per-expert token counts before dropping (``exp_counts``) and the buffer capacity.
The same inputs, weights and random state give DeepSpeed 0.19.8's choices, slots, weights and
``l_aux``: the same torch operations are applied in the same order, random draws included (RTS
uniforms, Gumbel noise, multiplicative jitter come from the same torch distributions).

Capacity: ``ceil(S / E * capacity_factor * k)`` but at least ``min_capacity``. Top-1 drops by
random token selection (``use_rts``: a random priority per token) or by position; top-2 drops
by position (1st choices first); top-k drops the lowest gate values. Dropless
(``drop_tokens=False``) sizes the buffers by the busiest expert over the expert-parallel group
(DeepSpeed's capacity; the MoE layer's ragged dispatch asks for this rank's alone and pads
nothing, ``ragged.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributions as tdist
import torch.nn.functional as F
from torch import Tensor

from dslaunch.engine.comm import api as comm_api


@dataclass
class Routes:
    l_aux: Tensor
    capacity: int
    num_experts: int
    indices: Tensor  # [k, S] int32: the expert of each choice, -1 when dropped
    locations: Tensor  # [k, S] int32: its slot in the expert's buffer
    gates: Tensor  # [k, S] fp32: its combine weight (0 when dropped)
    exp_counts: Tensor  # [E]: choices per expert before dropping

    def as_tuple(self):
        """DeepSpeed's sparse gate output order."""
        return (self.l_aux, self.capacity, self.num_experts, self.indices, self.locations,
                self.gates, self.exp_counts)

    def dense(self):
        """DeepSpeed's dense gate output: ``combine_weights`` [S, E, C] and its boolean
        ``dispatch_mask``."""
        k, s = self.indices.shape
        e, c = self.num_experts, int(self.capacity)
        combine = self.gates.new_zeros(s, e * c + 1)
        slots = route_slots(self.indices, self.locations, e, c)
        combine = combine.scatter_add(1, slots.t(), self.gates.t())
        combine = combine[:, :-1].reshape(s, e, c)
        return combine, combine.bool()


def route_slots(indices: Tensor, locations: Tensor, num_experts: int, capacity: int) -> Tensor:
    """Each choice's flat slot in the [E * C] buffer; dropped choices go to a spare slot E * C."""
    slots = indices.long() * capacity + locations.long()
    return torch.where(indices >= 0, slots, torch.full_like(slots, num_experts * capacity))


# -- random draws (cached samplers per device, as DeepSpeed keeps them) -----------------------------

_SAMPLERS: dict = {}


def _sampler(kind: str, device, make):
    key = (kind, device)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = make()
    return _SAMPLERS[key]


def multiplicative_jitter(x: Tensor, device: torch.device, epsilon: float = 1e-2) -> Tensor:
    """``x`` times a uniform draw in [1 - epsilon, 1 + epsilon] per element (the Switch
    Transformer's input jitter)."""
    if epsilon == 0:
        return x
    draw = _sampler(("jitter", epsilon), device, lambda: tdist.Uniform(
        torch.tensor(1.0 - epsilon, device=device), torch.tensor(1.0 + epsilon, device=device)).rsample)
    return x * draw(x.shape)


def gumbel_rsample(shape, device: torch.device) -> Tensor:
    draw = _sampler("gumbel", device, lambda: tdist.Gumbel(
        torch.tensor(0.0, device=device), torch.tensor(1.0, device=device)).rsample)
    return draw(shape)


def _uniform(shape, device) -> Tensor:
    draw = _sampler("uniform", device, lambda: tdist.Uniform(
        torch.tensor(0.0, device=device), torch.tensor(1.0, device=device)).rsample)
    return draw(shape)


# -- capacity ---------------------------------------------------------------------------------------

def _capacity(gates: Tensor, capacity_factor: Tensor, min_capacity: Tensor) -> Tensor:
    """ceil(S / E * factor), at least ``min_capacity`` (fp32 arithmetic, as DeepSpeed's)."""
    tokens, experts = gates.shape
    capacity = torch.ceil((tokens / experts) * capacity_factor).to(torch.int64)
    return torch.maximum(capacity, min_capacity.to(torch.int64))


def _is_parallel(group) -> bool:
    return group is not None and comm_api.dist.get_world_size(group) > 1


def _dropless_capacity(exp_counts: Tensor, ep_group) -> Tensor:
    """The busiest expert's count over the expert-parallel group: every rank's buffers have the
    same size, so the all-to-all splits evenly."""
    capacity = torch.max(exp_counts).to(exp_counts.device)
    if _is_parallel(ep_group):
        comm_api.all_reduce(capacity, op=comm_api.ReduceOp.MAX, group=ep_group)
    return capacity


def _stack(*rows: Tensor, dtype=None) -> Tensor:
    out = torch.stack(rows)
    return out if dtype is None else out.to(dtype)


# -- the gates --------------------------------------------------------------------------------------

def top1_routes(logits: Tensor, capacity_factor: float, min_capacity: int,
                used_token: Optional[Tensor] = None, noisy_gate_policy: Optional[str] = None,
                drop_tokens: bool = True, use_rts: bool = True, ep_group=None) -> Routes:
    if noisy_gate_policy == "RSample":
        noisy = logits + gumbel_rsample(logits.shape, device=logits.device)
    gates = F.softmax(logits, dim=1)
    capacity = _capacity(gates, torch.tensor(capacity_factor), torch.tensor(min_capacity))
    choice = torch.argmax(noisy if noisy_gate_policy == "RSample" else gates, dim=1)
    num_experts = int(gates.shape[1])
    mask = F.one_hot(choice, num_classes=num_experts)
    if used_token is not None:
        mask = used_token.unsqueeze(1) * mask
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    if not drop_tokens:
        capacity = _dropless_capacity(exp_counts, ep_group)
        capacity = min(capacity, torch.tensor(mask.size(0)).to(capacity.device))
    # load balancing: fraction of router probability times fraction of tokens, per expert
    l_aux = torch.sum(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0)) * num_experts
    # random token selection: a random priority among an expert's tokens, else the first ones
    priority = mask * _uniform(mask.shape, logits.device) if use_rts else mask
    if logits.shape[0] < min_capacity:
        raise AssertionError("No. of tokens (batch-size) should be greater than min_capacity. "
                             "Either set min_capacity to 0 or increase your batch size.")
    selected = min(capacity, torch.tensor(mask.size(0)).to(capacity.device))
    kept = torch.topk(priority, k=selected, dim=0)[1]
    mask = mask * torch.zeros_like(mask).scatter_(0, kept, 1)
    choice = torch.min(choice, mask.sum(dim=1) * num_experts - 1)  # dropped: -1
    locations = torch.cumsum(mask, dim=0) - 1
    gate = (gates * mask).sum(dim=1)
    location = torch.sum(locations * mask, dim=1)
    return Routes(l_aux, int(capacity), num_experts, _stack(choice, dtype=torch.int32),
                  _stack(location, dtype=torch.int32), _stack(gate), exp_counts)


def top2_routes(logits: Tensor, capacity_factor: float, min_capacity: int,
                drop_tokens: bool = True, ep_group=None,
                top2_2nd_expert_sampling: bool = True) -> Routes:
    gates = F.softmax(logits, dim=1)
    first = torch.argmax(gates, dim=1)
    num_experts = int(gates.shape[1])
    mask1 = F.one_hot(first, num_classes=num_experts)
    if top2_2nd_expert_sampling:  # the 2nd expert by the Gumbel-max trick
        logits = logits + gumbel_rsample(logits.shape, device=logits.device)
    second = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=num_experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1 + torch.sum(mask1, dim=0, keepdim=True)
    l_aux = (torch.mean(torch.mean(gates, dim=0) * torch.mean(mask1.float(), dim=0))
             * num_experts * num_experts)
    exp_counts = torch.sum(mask1 + mask2, dim=0).detach().to(logits.device)
    if drop_tokens:
        capacity = _capacity(gates, torch.tensor(capacity_factor * 2), torch.tensor(min_capacity))
        mask1 = mask1 * torch.lt(locations1, capacity)
        mask2 = mask2 * torch.lt(locations2, capacity)
    else:
        capacity = _dropless_capacity(exp_counts, ep_group)
    location1 = torch.sum(locations1 * mask1, dim=1)
    location2 = torch.sum(locations2 * mask2, dim=1)
    gate1 = torch.einsum("se,se->s", gates, mask1.float())
    gate2 = torch.einsum("se,se->s", gates, mask2.float())
    denom = torch.clamp(gate1 + gate2, min=torch.finfo(gate1.dtype).eps)
    gate1, gate2 = gate1 / denom, gate2 / denom
    first = torch.where(mask1.any(dim=1), first, torch.full_like(first, -1))
    second = torch.where(mask2.any(dim=1), second, torch.full_like(second, -1))
    return Routes(l_aux, int(capacity), num_experts, _stack(first, second, dtype=torch.int32),
                  _stack(location1, location2, dtype=torch.int32), _stack(gate1, gate2),
                  exp_counts)


def topk_routes(logits: Tensor, k: int, capacity_factor: float, min_capacity: int,
                drop_tokens: bool = True, ep_group=None, drop_policy: str = "probs") -> Routes:
    gates = F.softmax(logits, dim=1)
    num_experts = int(gates.shape[1])
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, 1)
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    l_aux = (torch.mean(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0))
             * num_experts * num_experts / k)
    if drop_tokens:
        capacity = _capacity(gates, torch.tensor(capacity_factor * k), torch.tensor(min_capacity))
        if drop_policy == "probs":  # an expert keeps its highest-gate tokens
            chosen = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
            selected = min(capacity, torch.tensor(gates.size(0)).to(capacity.device))
            _, keep = torch.topk(chosen, k=selected, dim=0, sorted=False)
            mask &= torch.zeros_like(gates, dtype=torch.bool).scatter_(0, keep, True)
            locations = torch.cumsum(mask, dim=0) - 1
        elif drop_policy == "position":  # an expert keeps its first tokens
            locations = torch.cumsum(mask, dim=0) - 1
            mask *= torch.lt(locations, capacity)
        else:
            raise ValueError(f"Invalid drop_policy: {drop_policy}")
    else:
        capacity = _dropless_capacity(exp_counts, ep_group)
        locations = torch.cumsum(mask, dim=0) - 1
    masked = gates * mask
    masked = masked / torch.clamp(torch.sum(masked, dim=-1, keepdim=True),
                                  min=torch.finfo(masked.dtype).eps)
    kept = mask.gather(1, top_idx)
    indices = torch.where(kept, top_idx, torch.full_like(top_idx, -1))
    return Routes(l_aux, int(capacity), num_experts, indices.t().contiguous().to(torch.int32),
                  (locations.gather(1, top_idx) * kept).t().contiguous().to(torch.int32),
                  masked.gather(1, top_idx).t().contiguous(), exp_counts)


# DeepSpeed's function names: dense (combine_weights, dispatch_mask) outputs unless sparse_routes

def _out(routes: Routes, sparse_routes: bool):
    if sparse_routes:
        return routes.as_tuple()
    combine, dispatch = routes.dense()
    return routes.l_aux, combine, dispatch, routes.exp_counts


def top1gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None,
               drop_tokens=True, use_rts=True, ep_group=None, sparse_routes=False,
               use_tutel=False):
    return _out(top1_routes(logits, capacity_factor, min_capacity, used_token,
                            noisy_gate_policy, drop_tokens, use_rts, ep_group), sparse_routes)


def top2gating(logits, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               top2_2nd_expert_sampling=True, sparse_routes=False):
    return _out(top2_routes(logits, capacity_factor, min_capacity, drop_tokens, ep_group,
                            top2_2nd_expert_sampling), sparse_routes)


def topkgating(logits, k, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               drop_policy="probs", sparse_routes=False):
    return _out(topk_routes(logits, k, capacity_factor, min_capacity, drop_tokens, ep_group,
                            drop_policy), sparse_routes)


class TopKGate(torch.nn.Module):
    """The router: a bias-free linear layer ``wg`` (model_dim -> num_experts) read in fp32, then
    the top-k gate. DeepSpeed's signature and attributes. Training uses ``capacity_factor`` and
    the noise policy; eval ``eval_capacity_factor`` and no noise."""

    def __init__(self, model_dim: int, num_experts: int, k: int = 1,
                 capacity_factor: float = 1.0, eval_capacity_factor: float = 1.0,
                 min_capacity: int = 8, noisy_gate_policy: Optional[str] = None,
                 drop_tokens: bool = True, use_rts: bool = True, ep_group=None,
                 top2_2nd_expert_sampling: bool = True) -> None:
        super().__init__()
        self.wg = torch.nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group) -> None:
        if self.ep_group is not None:
            raise AssertionError("Attempting to override an existing ep_group")
        self.ep_group = ep_group

    def routes(self, input: Tensor, used_token: Optional[Tensor] = None,
               group_capacity: bool = True) -> Routes:
        """``group_capacity=False``: a dropless gate sizes ``capacity`` by this rank's busiest
        expert alone (no all-reduce; the same routing), for a dispatch that needs no common
        buffer size."""
        ep_group = self.ep_group if group_capacity else None
        x = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = multiplicative_jitter(x, device=input.device)
        logits = F.linear(x, weight=self.wg.weight.float(), bias=None)
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1_routes(logits, factor, self.min_capacity, used_token,
                               self.noisy_gate_policy if self.training else None,
                               self.drop_tokens, self.use_rts, ep_group)
        if self.k == 2:
            return top2_routes(logits, factor, self.min_capacity, self.drop_tokens, ep_group,
                               self.top2_2nd_expert_sampling)
        return topk_routes(logits, self.k, factor, self.min_capacity, self.drop_tokens,
                           ep_group)

    def forward(self, input: Tensor, used_token: Optional[Tensor] = None,
                sparse_routes: bool = False, use_tutel: bool = False):
        return _out(self.routes(input, used_token), sparse_routes)
