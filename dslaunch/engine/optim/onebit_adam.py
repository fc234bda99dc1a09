"""1-bit Adam (Tang et al., 2021, "1-bit Adam: Communication Efficient Large-Scale Training with
Adam's Convergence Speed").

- Warmup, steps ``1..freeze_step``: exact Adam/AdamW on gradients all-reduced in full precision
  (the engine's 1-bit strategy does that all-reduce), with Adam's bias correction, so the
  warmup trajectory is the same as the plain ``Adam`` optimizer's.
- Compression stage, steps ``> freeze_step``: the variance ``v`` (and its bias correction) is
  frozen at its ``freeze_step`` value; there is no gradient all-reduce: each rank updates its
  momentum with its local gradient, and the momenta are averaged by the error-compensated 1-bit
  all-reduce (``engine/compressed.py``), after which every rank holds the same momentum and takes
  the same step ``p -= lr * (m_hat / (sqrt(v_hat) + eps) [+ weight_decay * p])``.

Weight decay is decoupled (AdamW) by default, as DeepSpeed's config type ``Adam`` is;
``adam_w_mode: false`` adds it to the gradient instead (L2).
"""

from __future__ import annotations

import math

import torch

from .onebit import OneBitOptimizer


class OneBitAdam(OneBitOptimizer):
    def __init__(self, params, lr=1e-3, freeze_step=100000, bias_correction=True,
                 betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False, weight_decay=0.0,
                 max_grad_norm=0.0, amsgrad=False, adam_w_mode=True, cuda_aware=False,
                 comm_backend_name=None):
        if amsgrad:
            raise ValueError("optimizer.params.amsgrad: 1-bit Adam does not support AMSGrad")
        if int(freeze_step) < 1:
            raise ValueError("optimizer.params.freeze_step: must be >= 1 (1-bit Adam needs a "
                             "full-precision warmup to estimate the variance it then freezes)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bool(bias_correction), max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, cuda_aware=cuda_aware,
                         comm_backend_name=comm_backend_name)
        self.freeze_step = int(freeze_step)
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        self.adam_w_mode = bool(adam_w_mode)

    def in_compression_stage(self) -> bool:
        return self.onebit_step >= self.freeze_step

    def wants_grad_allreduce(self) -> bool:
        return self.onebit_step + 1 <= self.freeze_step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.onebit_step += 1
        t = self.onebit_step
        compressing = t > self.freeze_step
        if compressing and t == self.freeze_step + 1:
            self.reset_errors()  # error feedback starts with the compression stage
        momenta = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd = group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"].fill_(t)
                g = self.grad_of(p)
                if wd and not self.adam_w_mode:
                    g = g.add(p, alpha=wd)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                if not compressing:
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                momenta.append(m)
        var_steps = min(t, self.freeze_step)
        denoms = []
        for group in self.param_groups:
            beta2 = group["betas"][1]
            bc2 = 1 - beta2 ** var_steps if group["bias_correction"] else 1.0
            for p in group["params"]:
                v = self.state[p]["exp_avg_sq"]
                if self.eps_inside_sqrt:
                    denoms.append((v / bc2).add_(group["eps"]).sqrt_())
                else:
                    denoms.append((v.sqrt() / math.sqrt(bc2)).add_(group["eps"]))
        if compressing:
            # the momentum itself is compressed, as in the paper and DeepSpeed (compressing
            # m / denom instead, tried here before, ended 18% above Adam after 400 steps)
            self.compressed_average(momenta)
            i = 0
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                bc1 = 1 - beta1 ** t if group["bias_correction"] else 1.0
                bound = self.adam_bound(beta1, beta2) * bc1  # m / bc1 / denom <= bound
                for p in group["params"]:
                    m = momenta[i]
                    self.clamp_to_adam(self.mask_unseen(m, self.state[p]["exp_avg_sq"]),
                                       denoms[i], bound)
                    i += 1
        i = 0
        for group in self.param_groups:
            beta1 = group["betas"][0]
            lr, wd = group["lr"], group["weight_decay"]
            bc1 = 1 - beta1 ** t if group["bias_correction"] else 1.0
            for p in group["params"]:
                m = self.state[p]["exp_avg"]
                denom = denoms[i]
                i += 1
                if wd and self.adam_w_mode:
                    p.mul_(1 - lr * wd)
                p.addcdiv_(m, denom, value=-lr / bc1)
        return loss

    def extra_state(self) -> dict:
        return {"freeze_step": self.freeze_step}
