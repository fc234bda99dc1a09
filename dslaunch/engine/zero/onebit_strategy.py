"""The optimizer strategy of the 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb).

Stage 0 data parallelism (``zero/stage0.py``: flat fp32 gradient buffer, accumulation, bf16/fp16
fp32 masters, bucketed all-reduce) with one change: the full-precision gradient all-reduce happens
only on the steps where the optimizer asks for it (``optimizer.wants_grad_allreduce()``: the
warmup of 1-bit Adam / 1-bit LAMB, the variance-update steps of 0/1 Adam). On every other step
the gradients stay local (averaged over the accumulation micro-steps only) and the optimizer
communicates compressed tensors itself.

Gradient clipping and the fp16 overflow check on a local-gradient step use the root mean square
of the ranks' local gradient norms (one float all-reduced, only when clipping or fp16 is on), so
every rank takes the same decision and no rank skips a step the others take.

ZeRO stages >= 1 partition the optimizer state, which the 1-bit optimizers need whole on every
rank (DeepSpeed does not combine them either): refused by ``dslaunch.config`` (``onebit_problems``).
"""

from __future__ import annotations

import math

import torch

from dslaunch.engine.base.memory import breakdown, optimizer_state_tensors
from dslaunch.engine.base.step_policy import GradNorm, loss_scale_of
from dslaunch.engine.zero.stage0 import Stage0Strategy


class OneBitStrategy(Stage0Strategy):
    stage = 0

    def __init__(self, model, optimizer, zero, comm, precision, **gradient_options):
        if not hasattr(optimizer, "wants_grad_allreduce"):
            raise TypeError("OneBitStrategy needs a 1-bit optimizer (OneBitAdam, ZeroOneAdam, "
                            "OneBitLamb)")
        super().__init__(model, optimizer, zero, comm, precision, **gradient_options)
        optimizer.attach_comm(comm)
        self._reduced = True

    # -- backward: reduce only when the optimizer wants averaged gradients ---------------------
    def prepare_backward(self, is_boundary: bool) -> None:
        super().prepare_backward(is_boundary)
        if is_boundary:
            self._reduced = self.optimizer.wants_grad_allreduce()
            if not self._reduced:
                self._sync_now = False

    def _reduce(self):
        if self._reduced:
            super()._reduce()

    # -- step: on a local-gradient step the norm is the ranks' root mean square -----------------
    def _boundary_grad_norm(self, clip_norm, loss_scaler, fp16: bool) -> GradNorm:
        if self._reduced or self.comm.world_size == 1:
            return super()._boundary_grad_norm(clip_norm, loss_scaler, fp16)
        local = torch.linalg.vector_norm(self.flat).item() if len(self.flat) else 0.0
        norm = local
        if self.step_policy.needs_norm(clip_norm, fp16):  # one float, so every rank agrees
            sq = torch.tensor([local * local if math.isfinite(local) else math.inf],
                              dtype=torch.float32, device=self.flat.device)
            self.comm.all_reduce(sq)
            norm = math.sqrt(sq.item() / self.comm.world_size)
        return GradNorm.from_scaled(norm, loss_scale_of(loss_scaler))

    def memory_breakdown(self) -> dict:
        opt = optimizer_state_tensors(self.optimizer)
        comp = getattr(self.optimizer, "_compressor", None)
        if comp is not None:
            opt += [comp.worker_error, comp.server_error, *(comp._buffers or ())]
        if self.masters is not None:
            opt = list(self.masters.values()) + opt
        grads = [self.flat] + [p.grad for p in self.params if p.grad is not None]
        return breakdown(list(self.model.parameters()), grads, opt)

