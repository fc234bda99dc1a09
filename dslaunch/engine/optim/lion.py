"""Lion (Chen et al., 2023): sign of an interpolated momentum, decoupled weight decay.

``lion_update_`` is one step on one tensor in torch ops (any device); ``Lion`` (the config's
``type: Lion``) and ``FusedLion`` off the CPU (``engine/optim/fused.py``) run it."""

from __future__ import annotations

import torch


def lion_update_(p, grad, exp_avg, *, lr: float, beta1: float, beta2: float,
                 weight_decay: float) -> None:
    """p and exp_avg updated in place: p -= lr * (sign(beta1*m + (1-beta1)*g) + wd*p)."""
    direction = (exp_avg * beta1).add_(grad, alpha=1 - beta1).sign_()
    if weight_decay:
        p.mul_(1 - lr * weight_decay)
    p.add_(direction, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                lion_update_(p, p.grad, state["exp_avg"], lr=group["lr"], beta1=beta1,
                             beta2=beta2, weight_decay=group["weight_decay"])
        return loss
