"""The ZeRO seam: what the engine asks of an optimizer strategy (stage 0, 1, 2 or 3).

The engine owns the loop (forward, ``backward`` scaling, boundaries, counters, schedules,
checkpoint files); a strategy owns the gradients, their reduction across the data-parallel group,
clipping, the optimizer step and the fp32 master weights of mixed precision. Call order per
micro-step: ``prepare_backward(b)``, ``loss.backward()``, ``after_backward(b)`` (``b`` = is this
micro-step an accumulation boundary); at a boundary then ``step(clip, scaler)`` and
``zero_grad()``. See docs/interfaces.md ("ZeRO seam") for the full contract.
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.engine.base.memory import breakdown, limit_allocator_retention, optimizer_state_tensors
from dslaunch.engine.base.step_policy import REPLICATED, GradNorm, StepPolicy


class OptimizerStrategy:
    """Base class with the defaults a strategy may keep."""

    stage = -1
    # gradient_allreduce_op: "mean" divides the reduced gradients by the data-parallel size,
    # "sum" leaves the sum (build_optimizer_strategy sets it from the config)
    average_gradients = True

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

    def rebind_world(self) -> None:
        """The group changed size under the strategy (in-process recovery): set up what depends
        on it (engine/recovery/; ZeRO 1-3 lay out again in ``repartition``)."""

    def dry_forward(self):
        """A context for the forward of a step in-process recovery abandoned, which must make no
        collective (a replacement makes the new group's first ones): only stage 3 gathers in
        forward."""
        return contextlib.nullcontext()

    # -- per micro-step ------------------------------------------------------------------------
    def prepare_backward(self, is_boundary: bool) -> None:
        """Called before ``loss.backward()``; lets hooks know whether to reduce this time."""

    def after_backward(self, is_boundary: bool) -> None:
        raise NotImplementedError

    def finish_accumulation(self) -> None:
        """``managed_gradient_accumulation: false``: ``step()`` is the boundary, after backwards
        that reduced nothing; reduce the accumulated gradients now. Stages that reduce at every
        backward (2, 3) have nothing left to do and override this."""
        self.after_backward(True)

    # -- per boundary --------------------------------------------------------------------------
    # the overflow / clip decision (engine/base/step_policy.py); a subclass supplies the norm and the
    # way it scales its gradients and steps
    step_policy: StepPolicy = REPLICATED

    def step(self, clip_norm: float = None, loss_scaler=None) -> bool:
        """Unscale, check overflow, clip, optimizer step. Returns False when skipped (overflow)."""
        fp16 = getattr(self.precision, "name", None) == "fp16"
        norm = self._boundary_grad_norm(clip_norm, loss_scaler, fp16)
        decision = self.step_policy.decide(norm, clip_norm, loss_scaler, fp16)
        self._grad_norm = decision.grad_norm
        if decision.skip:
            self._after_skip()
            return False
        self._scale_grads_and_step(decision.coef)
        self.step_policy.stepped(loss_scaler)
        return True

    def _boundary_grad_norm(self, clip_norm, loss_scaler, fp16: bool) -> GradNorm:
        """The global gradient norm of this boundary (unscaled), as ``step_policy`` wants it."""
        raise NotImplementedError

    def _scale_grads_and_step(self, coef: float) -> None:
        """Multiply the gradients by ``coef`` (when not 1), step the optimizer, publish weights."""
        raise NotImplementedError

    def _after_skip(self) -> None:
        """An overflow skipped the step: drop what only this step would have used."""

    def abandon(self) -> None:
        """In-process recovery: drop the interrupted step's gradients (and whatever a strategy
        keeps in flight for it: ZeRO 1-2 override)."""
        self.zero_grad()

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

    # -- life cycle ------------------------------------------------------------------------------
    def empty_partition_cache(self) -> None:
        """Release parameters gathered from partitions (stage 3); nothing to do otherwise."""

    def remove_hooks(self) -> None:
        """Remove the hooks this strategy put on the model (``engine.destroy()``)."""
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []


def broadcast_model(model: torch.nn.Module, comm, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s weights and buffers (what DDP does); MoE experts
    (different on the ranks of an expert-parallel group) from their replica on expert-data-parallel
    rank 0 (``engine/parallel/experts.py``)."""
    if comm.world_size == 1:
        return
    from dslaunch.engine.parallel.experts import ExpertGroups, is_expert

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if not is_expert(t):
                comm.broadcast(t.data, src)
    experts = ExpertGroups(model, comm)
    if experts:
        experts.broadcast(model)
