"""LAMB (You et al., 2019) with DeepSpeed's knobs: Adam moments with bias correction, the update
``m̂/(√v̂+eps) + weight_decay·p`` (``m̂/√(v̂+eps) + ...`` with ``eps_inside_sqrt``) scaled per
parameter tensor by the trust ratio ``‖p‖/‖update‖`` clamped to [min_coeff, max_coeff] (1 when
either norm is 0). Torch ops, any device.

The signature is DeepSpeed's FusedLamb's (``dslaunch.ops.lamb.FusedLamb`` is this class).
``max_grad_norm`` is kept in the param groups and not applied (DeepSpeed's FusedLamb applies it
only to gradient norms handed to ``step()``): clip with the config's ``gradient_clipping`` or
``torch.nn.utils.clip_grad_norm_``."""

from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0, max_coeff=10.0,
                 min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise ValueError("optimizer.params.amsgrad: Lamb does not support amsgrad")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, max_coeff=max_coeff, min_coeff=min_coeff,
                        eps_inside_sqrt=eps_inside_sqrt, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)

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
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if group["bias_correction"]:
                    m_hat = m / (1 - beta1 ** step)
                    v_hat = v / (1 - beta2 ** step)
                else:
                    m_hat, v_hat = m, v
                if group.get("eps_inside_sqrt", False):  # absent in older checkpoints
                    update = m_hat / (v_hat + group["eps"]).sqrt()
                else:
                    update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm = torch.linalg.vector_norm(p).item()
                u_norm = torch.linalg.vector_norm(update).item()
                trust = 1.0
                if w_norm > 0 and u_norm > 0:
                    trust = min(max(w_norm / u_norm, group["min_coeff"]), group["max_coeff"])
                p.add_(update, alpha=-group["lr"] * trust)
        return loss
