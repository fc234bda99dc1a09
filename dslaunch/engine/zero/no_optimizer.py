"""Engines built without an optimizer: evaluation, frozen reference / reward / EMA models.

``dslaunch.initialize(model=..., config=...)`` with no ``optimizer=`` and no ``"optimizer"``
section (what TRL, DeepSpeed-Chat, OpenRLHF and Lightning do for models they only run forward)
gets one of these strategies instead of a training one:

- stages 0-2: the whole model on every rank, rank 0's weights broadcast (what DDP does) and cast
  to the training dtype;
- stage 3: every parameter (frozen ones too) partitioned and gathered per module around its
  forward, as the training strategy does (``stage3.py``), but with no fp32 masters, gradient
  shards or gradient hooks.

Forward, ``zero.GatheredParameters``, ``save_checkpoint`` / ``load_checkpoint`` (weights only) and
``save_16bit_model`` work; the engine refuses ``backward()`` and ``step()`` with
``NoOptimizerError`` before autograd runs.
"""

from __future__ import annotations

import torch

from dslaunch.engine.zero.base import OptimizerStrategy, broadcast_model
from dslaunch.engine.zero.common import get_comm
from dslaunch.engine.zero.stage3 import Stage3Strategy
from dslaunch.engine.zero.zero_init import register_strategy


class NoOptimizerError(RuntimeError):
    """backward() or step() on an engine that has no optimizer."""


def _refuse(what: str):
    # the engine refuses first (deepspeed_surface.py); this guards direct callers
    raise NoOptimizerError(f"{what}: this strategy has no optimizer (forward only)")


class _ForwardOnly:
    """The training half of the strategy seam, refused; state without an optimizer."""

    optimizer = None

    def prepare_backward(self, is_boundary: bool) -> None:
        _refuse("backward")

    def after_backward(self, is_boundary: bool = True) -> None:
        _refuse("backward")

    def step(self, clip_norm=None, loss_scaler=None) -> bool:
        _refuse("step")

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # nothing accumulates

    def state_dict(self) -> dict:
        return {"optimizer": None}

    def load_state_dict(self, sd: dict, load_optimizer_states: bool = True) -> None:
        pass  # weights come through load_module_state_dict; there is no optimizer state


class NoOptimizerStrategy(_ForwardOnly, OptimizerStrategy):
    """Stages 0-2 without an optimizer: whole parameters, identical on every rank."""

    def __init__(self, model, zero, comm, precision):
        super().__init__(model, None, zero, get_comm(comm), precision)
        self.stage = zero.stage
        broadcast_model(model, self.comm)
        precision.cast_model(model)


class Stage3ForwardOnly(_ForwardOnly, Stage3Strategy):
    """Stage 3 without an optimizer (DeepSpeed's parameter-only ``DeepSpeedZeRoOffload``)."""

    def __init__(self, model, zero, comm, precision, aio=None):
        comm = get_comm(comm)
        OptimizerStrategy.__init__(self, model, None, zero, comm, precision)
        named = [_all_parameters(model)]
        if not named[0]:
            raise ValueError("dslaunch.initialize: the model has no parameters to partition")
        self.offload_optimizer = False
        self.dtype, self.device = precision.dtype, named[0][0][1].device
        self.mixed = self.dtype != torch.float32
        self.opt_device, self.need_master = self.device, False  # nothing is stepped
        self._partition_params(model, named, comm, aio)
        register_strategy(self)  # GatheredParameters finds our buckets
        self._install_module_hooks(model)

    def _install_hooks(self, model):
        self._install_module_hooks(model)

    def _begin_forward(self, module, args):
        # every forward records / follows the module order: units are prefetched along it
        self.fetcher.begin_forward(True)

    def _post_forward(self, module, args, output):
        self.fetcher.post_forward(module, False)  # no backward follows: release now
        return output


def _all_parameters(model) -> list:
    """[(name, param)] of every parameter, trainable or not, each once (tied ones too)."""
    seen, named = set(), []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            named.append((name, p))
    return named


def build_no_optimizer_strategy(model, cfg, comm, precision) -> OptimizerStrategy:
    """The forward-only strategy for the config's ZeRO stage (``cfg``: the typed config)."""
    zero = cfg.zero_optimization
    if zero.stage == 3:
        return Stage3ForwardOnly(model, zero, comm, precision, aio=cfg.aio)
    return NoOptimizerStrategy(model, zero, comm, precision)
