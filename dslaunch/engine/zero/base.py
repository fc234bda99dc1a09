"""The ZeRO seam: what the engine asks of an optimizer strategy (stage 0, 1, 2 or 3).

The engine owns the loop (forward, ``backward`` scaling, boundaries, counters, schedules,
checkpoint files); a strategy owns the gradients, their reduction across the data-parallel group,
clipping, the optimizer step and the fp32 master weights of mixed precision. Call order per
micro-step: ``prepare_backward(b)``, ``loss.backward()``, ``after_backward(b)`` (``b`` = is this
micro-step an accumulation boundary); at a boundary then ``step(clip, scaler)`` and
``zero_grad()``. See docs/interfaces.md ("ZeRO seam") for the full contract.
"""

from __future__ import annotations

import math

import torch

from ..memory import breakdown, limit_allocator_retention, optimizer_state_tensors


class OptimizerStrategy:
    """Base class with the defaults a strategy may keep."""

    stage = -1

    def __init__(self, model, optimizer, zero, comm, precision):
        """``zero``: the typed ``zero_optimization`` section (dslaunch.config.sections)."""
        self.model = model
        self.optimizer = optimizer
        self.zero = zero
        self.comm = comm
        self.precision = precision
        self._grad_norm = None
        # what a strategy frees must leave the process, or peak RSS never falls with the stage
        limit_allocator_retention()

    # -- per micro-step ------------------------------------------------------------------------
    def prepare_backward(self, is_boundary: bool) -> None:
        """Called before ``loss.backward()``; lets hooks know whether to reduce this time."""

    def after_backward(self, is_boundary: bool) -> None:
        raise NotImplementedError

    # -- per boundary --------------------------------------------------------------------------
    def step(self, clip_norm: float, loss_scaler) -> bool:
        """Unscale, check overflow, clip, optimizer step. Returns False when skipped (overflow)."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        raise NotImplementedError

    def grad_norm(self):
        """The global gradient norm (unscaled, before clipping) of the last step, or None."""
        return self._grad_norm

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict, load_optimizer_states: bool = True) -> None:
        if load_optimizer_states:
            self.optimizer.load_state_dict(sd["optimizer"])
        self.sync_from_model()

    def sync_from_model(self) -> None:
        """The model's weights were replaced (checkpoint load): refresh master copies."""

    def module_state_dict(self) -> dict:
        """The full model weights as rank 0 saves them (stage 3 gathers them first)."""
        return self.model.state_dict()

    def load_module_state_dict(self, sd: dict, strict: bool = True) -> None:
        self.model.load_state_dict(sd, strict=strict)

    def memory_breakdown(self) -> dict:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return breakdown(list(self.model.parameters()), grads,
                         optimizer_state_tensors(self.optimizer))


def clip_coefficient(norm: float, clip_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor (max_norm / (norm + 1e-6), at most 1)."""
    if clip_norm and clip_norm > 0 and math.isfinite(norm):
        return min(1.0, clip_norm / (norm + 1e-6))
    return 1.0


def broadcast_model(model: torch.nn.Module, comm, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s weights and buffers (what DDP does)."""
    if comm.world_size == 1:
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            comm.broadcast(t.data, src)
