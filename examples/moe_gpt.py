"""examples/gpt.py's GPT with a mixture-of-experts MLP in every other block, in plain PyTorch: the
MoE layer class is passed in (``dslaunch.moe.layer.MoE`` in examples/train_moe_gpt.py,
``deepspeed.moe.layer.MoE`` in the benchmark's DeepSpeed peer), so both train the same model.

``MoEGPT(cfg, moe_cls, experts=4, ep=1, top_k=1, capacity_factor=1.0, min_capacity=4,
dropless=False, aux_coef=0.01)``: blocks 1, 3, ... hold ``moe_cls(d_model, expert=MLP(cfg),
num_experts=experts, ep_size=ep, k=top_k, ...)`` (deterministic routing: no random token
selection, no noise); ``forward(tokens, targets)`` returns the cross entropy plus ``aux_coef``
times the layers' load-balancing losses. ``last_aux`` and ``dropped_fraction()`` describe the last
forward on this rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt import GPT, MLP, GPTConfig


class MoEMLP(nn.Module):
    """A block's MLP as a mixture of experts; keeps the layer's last aux loss and expert counts."""

    def __init__(self, cfg: GPTConfig, moe_cls, experts, ep, top_k, capacity_factor,
                 min_capacity, dropless):
        super().__init__()
        self.moe = moe_cls(cfg.d_model, expert=MLP(cfg), num_experts=experts, ep_size=ep,
                           k=top_k, capacity_factor=capacity_factor,
                           eval_capacity_factor=capacity_factor, min_capacity=min_capacity,
                           drop_tokens=not dropless, use_rts=False)
        self.k, self.experts, self.drops = top_k, experts, not dropless
        self.capacity_factor, self.min_capacity = capacity_factor, min_capacity
        self.l_aux = self.exp_counts = None
        self.tokens = 0

    def forward(self, x):
        out, self.l_aux, self.exp_counts = self.moe(x)
        self.tokens = x.shape[0] * x.shape[1]
        return out

    def dropped(self) -> tuple:
        """(token assignments over capacity, assignments) of the last forward on this rank."""
        assigned = self.tokens * self.k
        if not self.drops or self.exp_counts is None:
            return 0, assigned
        capacity = max(math.ceil(self.k * self.tokens / self.experts * self.capacity_factor),
                       self.min_capacity)
        counts = self.exp_counts.detach().to("cpu", torch.int64)
        return int((counts - capacity).clamp(min=0).sum()), assigned


class MoEGPT(GPT):
    """examples/gpt.py's GPT with blocks 1, 3, ... holding an MoE MLP; the loss adds
    ``aux_coef`` x the layers' load-balancing losses."""

    def __init__(self, cfg: GPTConfig, moe_cls, experts=4, ep=1, top_k=1, capacity_factor=1.0,
                 min_capacity=4, dropless=False, aux_coef=0.01):
        super().__init__(cfg)
        for i, block in enumerate(self.blocks):
            if i % 2 == 1:
                block.mlp = MoEMLP(cfg, moe_cls, experts, ep, top_k, capacity_factor,
                                   min_capacity, dropless)
        self.aux_coef = aux_coef
        self.moe_layers = [b.mlp for b in self.blocks if isinstance(b.mlp, MoEMLP)]
        self.last_aux = 0.0

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        aux = sum(m.l_aux for m in self.moe_layers)
        self.last_aux = float(aux.detach()) if torch.is_tensor(aux) else float(aux)
        return loss + self.aux_coef * aux

    def dropped_fraction(self) -> float:
        dropped = assigned = 0
        for m in self.moe_layers:
            d, a = m.dropped()
            dropped, assigned = dropped + d, assigned + a
        return dropped / max(assigned, 1)
