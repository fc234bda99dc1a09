"""DeepSpeed's FusedAdam and FusedLion signatures, on any device:

    FusedAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
              adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True)
    FusedLion(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, set_grad_none=True)

CPU parameters are stepped by the compiled CPU op (``DSCPUAdam`` / ``DSCPULion`` beneath, fp32
states, same torch fallback when the op cannot be built), as DeepSpeed's own CPU accelerator
runs FusedAdam through its CPU Adam kernel; this op also takes bf16 parameters with fp32 states
and ``bias_correction=False``, which torch's fused CPU Adam does not. Parameters on another
device (CUDA) keep their states in the parameter's dtype and shape, as DeepSpeed's FusedAdam
does, and are stepped by torch's fused Adam / AdamW kernel (FusedAdam; it always corrects bias,
so ``bias_correction=False`` there is an error) or by Lion's torch ops (FusedLion).

``set_grad_none``: what ``zero_grad()`` does when not told (True: grads set to None, False:
zeroed in place). ``.compiled``: whether the CPU op is in use (False when no parameter was on
the CPU at construction, or when the op cannot be built here).
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam as torch_adam  # the functional form of torch.optim.Adam

from dslaunch.engine.optim.cpu_adam import DSCPUAdam, DSCPULion
from dslaunch.engine.optim.lion import lion_update_


class _AnyDevice:
    """Mixin over a compiled CPU optimizer: states of parameters off the CPU follow the
    parameter's dtype; the op is loaded only once a parameter is on the CPU."""

    def _needs_op(self) -> bool:
        return any(self._for_op(p) for g in self.param_groups for p in g["params"])

    def _state_dtype(self, p):
        return super()._state_dtype(p) if self._for_op(p) else p.dtype

    def _states_elsewhere(self, p, names):
        state = self.state[p]
        if not state:
            state["step"] = 0
            for name in names:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        return [state[name].view_as(p) for name in names]  # a loaded state may be flat

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)


class FusedAdam(_AnyDevice, DSCPUAdam):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support amsgrad (nor does DeepSpeed's)")
        self.set_grad_none = set_grad_none
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, adamw_mode=adam_w_mode)

    def _step_elsewhere(self, group, params):
        if not group["bias_correction"]:
            raise ValueError(f"FusedAdam: bias_correction=False is not supported for parameters "
                             f"on {params[0].device} (torch's fused Adam always corrects bias); "
                             "it is for CPU parameters")
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            m, v = self._states_elsewhere(p, ("exp_avg", "exp_avg_sq"))
            grads.append(p.grad)
            exp_avgs.append(m)
            exp_avg_sqs.append(v)
            # torch's kernel counts the step itself: hand it the count before this step
            steps.append(torch.full((), self.state[p]["step"] - 1, dtype=torch.float32,
                                    device=p.device))
        beta1, beta2 = group["betas"]
        torch_adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, fused=True,
                   decoupled_weight_decay=self.adamw_mode, amsgrad=False, beta1=beta1,
                   beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                   eps=group["eps"], maximize=False)


class FusedLion(_AnyDevice, DSCPULion):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0,
                 set_grad_none=True):
        self.set_grad_none = set_grad_none
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)

    def _step_elsewhere(self, group, params):
        beta1, beta2 = group["betas"]
        for p in params:
            (m,) = self._states_elsewhere(p, ("exp_avg",))
            lion_update_(p, p.grad, m, lr=group["lr"], beta1=beta1, beta2=beta2,
                         weight_decay=group["weight_decay"])


__all__ = ["FusedAdam", "FusedLion"]
