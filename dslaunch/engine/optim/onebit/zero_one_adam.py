"""0/1 Adam (Lu et al., 2022, "Maximizing Communication Efficiency for Large-scale Training via
0/1 Adam"), with DeepSpeed's parameters.

Phase 1, steps ``1..var_freeze_step`` (adaptive variance freezing): the variance is updated only
on steps ``t`` with ``t % var_interval == 0``; on those steps the engine's 1-bit strategy
all-reduces the gradients in full precision; on every other step the local gradients are
averaged by the error-compensated 1-bit all-reduce and only the momentum is updated.
``var_interval`` starts at 1 and doubles after every ``var_update_scaler`` variance updates.

Phase 2, steps ``> var_freeze_step`` (1-bit sync with local steps): the variance is frozen, no
gradient is all-reduced; each rank steps locally with its own momentum, and every
``local_step_interval`` steps the ranks synchronise: the parameter change since the last sync,
times the (frozen) denominator, i.e. the lr-weighted sum of the updates' momenta, is averaged
with the 1-bit all-reduce, every rank moves from the last synchronised parameters by that
average, and the momentum restarts from it. ``local_step_interval`` starts at 1 and doubles
every ``local_step_scaler`` steps, up to ``local_step_clipper``.

Differences from DeepSpeed's implementation, on purpose: Adam's bias correction is applied
(``1 - beta1^t`` for the momentum, ``1 - beta2^k`` for the variance after ``k`` variance updates;
``bias_correction: false`` turns it off as in DeepSpeed); the synchronised parameters are kept
(``anchor``) instead of subtracting the local change again, so every rank ends a sync with
bit-identical parameters; the error buffers are kept in the checkpoint (DeepSpeed drops them);
a coordinate whose variance is exactly 0 (no gradient on any variance step) never moves, in
either phase (DeepSpeed asks the user for an ``exp_avg_mask``): one bit cannot say zero, and
``m / eps`` would throw it far away; the 1-bit momentum of phase 1 is clamped to the largest
step exact Adam could take (``clamp_to_adam``; without it: +21% final loss at 1000 steps).
Between syncs the ranks' parameters differ (that is the algorithm); a checkpoint taken there
saves rank 0's parameters.
"""

from __future__ import annotations

import math

import torch

from dslaunch.engine.optim.onebit.optimizer import OneBitOptimizer


class ZeroOneAdam(OneBitOptimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0,
                 var_freeze_step=100000, var_update_scaler=16, local_step_scaler=32678,
                 local_step_clipper=16, amsgrad=False, cuda_aware=False, comm_backend_name=None):
        if amsgrad:
            raise ValueError("optimizer.params.amsgrad: 0/1 Adam does not support AMSGrad")
        for key, value in (("var_freeze_step", var_freeze_step),
                           ("var_update_scaler", var_update_scaler),
                           ("local_step_scaler", local_step_scaler),
                           ("local_step_clipper", local_step_clipper)):
            if int(value) < 1:
                raise ValueError(f"optimizer.params.{key}: must be >= 1, got {value}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bool(bias_correction), max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, cuda_aware=cuda_aware,
                         comm_backend_name=comm_backend_name)
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        self.var_freeze_step = int(var_freeze_step)
        self.var_update_scaler = int(var_update_scaler)
        self.local_step_scaler = int(local_step_scaler)
        self.local_step_clipper = int(local_step_clipper)
        self.var_interval = 1
        self.var_counter = 0
        self.var_updates = 0
        self.local_step_interval = 1
        self.local_step_counter = 0
        self.lrs = [0.0] * len(self.param_groups)  # per group: sum of lrs since the last sync
        self._fdenoms = None  # phase 2: (denominators, unseen masks) of the frozen variance

    # -- stage logic -------------------------------------------------------------------------------
    def _frozen(self, t: int) -> bool:
        return t > self.var_freeze_step

    def in_compression_stage(self) -> bool:
        return self._frozen(self.onebit_step + 1)

    def wants_grad_allreduce(self) -> bool:
        t = self.onebit_step + 1
        return not self._frozen(t) and t % self.var_interval == 0

    def _denom(self, group, v, bc2):
        if self.eps_inside_sqrt:
            return (v / bc2).add_(group["eps"]).sqrt_()
        return (v.sqrt() / math.sqrt(bc2)).add_(group["eps"])

    def _frozen_denoms(self):
        """Phase 2: per parameter, the denominator of the frozen variance (computed once: it
        cannot change any more) and the mask of the coordinates whose variance is exactly 0
        (no gradient on any variance step). Their denominator is +inf, so neither a local step
        nor a sync moves them, as 1-bit Adam's frozen denominator (see ``mask_unseen``); with
        ``eps`` there, one local gradient stepped such a coordinate by ``lr * m / eps``
        (~1e5 x Adam's largest step) until the next sync put it back."""
        if self._fdenoms is None:
            denoms, unseen = [], []
            for group in self.param_groups:
                bc2 = (1 - group["betas"][1] ** max(self.var_updates, 1)) \
                    if group["bias_correction"] else 1.0
                for p in group["params"]:
                    v = self.state[p]["exp_avg_sq"]
                    zero = v == 0
                    denoms.append(self._denom(group, v, bc2).masked_fill_(zero, math.inf))
                    unseen.append(zero)
            self._fdenoms = (denoms, unseen)
        return self._fdenoms

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        var_step = self.wants_grad_allreduce()
        self.onebit_step += 1
        t = self.onebit_step
        frozen = self._frozen(t)
        if frozen and t == self.var_freeze_step + 1:
            self.reset_errors()  # phase 2 compresses another quantity than phase 1
            self.lrs = [0.0] * len(self.param_groups)
            self._fdenoms = None
        params = self.all_params()
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if frozen and "anchor" not in state:
                state["anchor"] = p.detach().clone()
            state["step"].fill_(t)

        grads = [self.grad_of(p) for p in params]
        if not frozen and not var_step:
            grads = [g.clone() for g in grads]
            self.compressed_average(grads)  # phase 1: 1-bit averaged gradient
        if var_step:
            self.var_updates += 1
        fdenoms = iter(self._frozen_denoms()[0]) if frozen else None
        gi = iter(grads)
        for gi_, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            bc1 = 1 - beta1 ** t if group["bias_correction"] else 1.0
            bc2 = (1 - beta2 ** max(self.var_updates, 1)) if group["bias_correction"] else 1.0
            for p in group["params"]:
                g = next(gi)
                state = self.state[p]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                if var_step:
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = next(fdenoms) if frozen else self._denom(group, v, bc2)
                if not var_step and not frozen:  # m came from a 1-bit gradient
                    self.clamp_to_adam(self.mask_unseen(m, v), denom,
                                       self.adam_bound(beta1, beta2) * bc1)
                if wd:
                    p.mul_(1 - lr * wd)
                p.addcdiv_(m, denom, value=-lr / bc1)
            if frozen:
                self.lrs[gi_] += lr

        if not frozen:
            if var_step:
                self.var_counter += 1
                if self.var_counter == self.var_update_scaler:
                    self.var_counter = 0
                    self.var_interval *= 2
            return loss

        if t % self.local_step_interval == 0:
            self._sync(t)
        self.local_step_counter += 1
        if self.local_step_counter == self.local_step_scaler:
            self.local_step_counter = 0
            self.local_step_interval = min(self.local_step_clipper, self.local_step_interval * 2)
        return loss

    def _sync(self, t: int) -> None:
        """Average the lr-weighted momentum since the last sync (1 bit) and move every rank from
        the synchronised parameters by it."""
        denoms, unseen = self._frozen_denoms()
        moved = [(self.state[p]["anchor"] - p).mul_(d).masked_fill_(z, 0.0)  # 0 * inf there
                 for p, d, z in zip(self.all_params(), denoms, unseen)]
        self.compressed_average(moved)
        i = 0
        for gi_, group in enumerate(self.param_groups):
            # each local step moved a coordinate by at most lr * bound: so may their average;
            # the clamp also zeroes the unseen coordinates (+inf denominator)
            bound = self.adam_bound(*group["betas"]) * self.lrs[gi_]
            for _ in group["params"]:
                self.clamp_to_adam(moved[i], denoms[i], bound)
                i += 1
        i = 0
        for gi_, group in enumerate(self.param_groups):
            lrs = max(self.lrs[gi_], 1e-30)
            beta1 = group["betas"][0]
            bc1 = 1 - beta1 ** t if group["bias_correction"] else 1.0
            wd = group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                w, denom = moved[i], denoms[i]
                p.copy_(state["anchor"]).sub_(w / denom)
                state["anchor"].copy_(p)
                # the momentum restarts from the average update direction of the interval
                m_hat = w / lrs
                if wd:
                    m_hat.sub_((p * denom).masked_fill_(unseen[i], 0.0), alpha=wd)
                i += 1
                state["exp_avg"].copy_(m_hat.mul_(bc1))
        self.lrs = [0.0] * len(self.param_groups)

    # -- state -------------------------------------------------------------------------------------
    _COUNTERS = ("var_interval", "var_counter", "var_updates", "local_step_interval",
                 "local_step_counter", "lrs")

    def extra_state(self) -> dict:
        return {k: getattr(self, k) for k in self._COUNTERS}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._fdenoms = None  # recomputed from the loaded variance

    def load_extra_state(self, extra: dict) -> None:
        for k in self._COUNTERS:
            if k in extra:
                setattr(self, k, list(extra[k]) if k == "lrs" else int(extra[k]))
