"""The ZeRO-3 parameter side as DeepSpeed shows it: ``engine.optimizer`` of a stage-3 engine
built without an optimizer (DeepSpeed's ``DeepSpeedZeRoOffload``), and
``engine.optimizer.parameter_offload`` of a stage-3 engine that trains.

Frameworks reach for it to run a ZeRO-3 model with its weights gathered once and the per-module
gather / release switched off (TRL's ``unwrap_model_for_generation``, used by its trainers and by
LLaMA-Factory and Axolotl): inside ``zero.GatheredParameters(model.parameters())`` they remove
every handle in ``forward_hooks`` / ``backward_hooks``, empty both lists and clear each parameter's
``ds_active_sub_modules``, generate, then call ``_register_deepspeed_module(module)`` (before
DeepSpeed 0.16.4: ``_register_hooks_recursively``) to put the hooks back.

Here ``forward_hooks`` are the stage-3 strategy's module hooks themselves (gather before a
module's forward, release after it, the begin / end of a pass); ``backward_hooks`` is empty and
stays so, because stage 3 hooks a forward's outputs for the backward gather from inside those
forward hooks (nothing to remove once they are gone). ``ds_active_sub_modules`` is not tracked:
always an empty set.
"""

from __future__ import annotations

import torch


class ExternalParameters:
    """``module.ds_external_parameters()``: ``[(id, parameter)]`` registered on ``module`` with
    ``zero.register_external_parameter`` (a picklable callable, as ``PartitionNumel``)."""

    __slots__ = ("module",)

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self) -> list:
        return [(id(p), p) for p in self.module.__dict__.get("_dsl_external_params", [])]


class ZeroParamOffload:
    """The stage-3 strategy's module hooks, as DeepSpeed's ``DeepSpeedZeRoOffload`` exposes its
    own. ``module`` is the model the engine wraps."""

    def __init__(self, strategy, module: torch.nn.Module):
        self._strategy = strategy
        self.module = module
        self.backward_hooks: list = []
        self.param_groups: list = []  # nothing to step: DeepSpeed's object has no optimizer
        for m in module.modules():
            if "ds_external_parameters" not in m.__dict__:
                m.ds_external_parameters = ExternalParameters(m)
        for p in module.parameters():
            if not hasattr(p, "ds_active_sub_modules"):
                p.ds_active_sub_modules = set()

    @property
    def forward_hooks(self) -> list:
        return self._strategy._module_hooks

    @forward_hooks.setter
    def forward_hooks(self, hooks: list) -> None:
        self._strategy._module_hooks = hooks

    def _register_deepspeed_module(self, module: torch.nn.Module) -> None:
        """Put the module hooks back (after ``forward_hooks`` were removed)."""
        if module is not self.module:
            raise ValueError("_register_deepspeed_module: pass the engine's own module "
                             "(optimizer.module); dslaunch's stage 3 hooks the model it "
                             "partitioned, not another")
        for h in self._strategy._module_hooks:  # never two sets of hooks at once
            h.remove()
        self._strategy._install_module_hooks(module)

    _register_hooks_recursively = _register_deepspeed_module  # DeepSpeed before 0.16.4

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def __repr__(self) -> str:
        return f"ZeroParamOffload({type(self.module).__name__}, {len(self.forward_hooks)} hooks)"
