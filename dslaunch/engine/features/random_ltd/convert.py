"""Turning a model's layers into random-LTD layers, binding them to the engine's scheduler, and
the state-dict names with and without the wrapper (DeepSpeed 0.19.8's ``data_routing.helper``
and ``engine.random_ltd_initialize``).

Which wrapped layers drop tokens: those whose module name ends in one of ``random_ltd_layer_id``
(``transformer.h.3`` is layer 3). DeepSpeed tests whether the id's digits appear anywhere in the
name, so in a model under ``gpt2.`` its id 2 also takes layer 0; here only the layer's own index
counts.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from torch.nn import Module

from dslaunch.engine.features.random_ltd.layer import KEY, RandomLayerTokenDrop

WRAPPED = ".random_ltd_layer"  # the wrapper's attribute in state-dict names


def _inner(model):
    return model.module if hasattr(model, "module") else model


def convert_to_random_ltd(model, convert_type):
    """Wraps every ``convert_type`` module of ``model`` (an engine, or the bare model) in a
    ``RandomLayerTokenDrop``. On an engine (DeepSpeed's way: after ``initialize``) the layers
    named in the config are bound at once; on a bare model ``initialize`` binds them."""
    inner = _inner(model)
    names = [name for name, m in inner.named_modules() if isinstance(m, convert_type) and name]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = inner.get_submodule(parent_name) if parent_name else inner
        setattr(parent, attr, RandomLayerTokenDrop(getattr(parent, attr)))
    if hasattr(model, "random_ltd_initialize"):
        model.random_ltd_initialize()
    return model


def _layer_index(name: str):
    digits = [part for part in name.split(".") if part.isdigit()]
    return int(digits[-1]) if digits else None


def bind_layers(module: Module, config: dict, scheduler) -> int:
    """Binds the wrapped layers ``config["random_ltd_layer_id"]`` names to ``scheduler``, in
    module order (the first one draws the positions); raises unless there are
    ``random_ltd_layer_num`` of them. Returns how many were bound."""
    wanted = set(config["random_ltd_layer_id"])
    count = 0
    for name, layer in module.named_modules():
        if isinstance(layer, RandomLayerTokenDrop) and _layer_index(name) in wanted:
            layer.init_config(config, scheduler, count)
            count += 1
    if count != config["random_ltd_layer_num"]:
        wrapped = [n for n, m in module.named_modules() if isinstance(m, RandomLayerTokenDrop)]
        raise ValueError(f"{KEY}.random_ltd_layer_num: {config['random_ltd_layer_num']}, but "
                         f"{count} wrapped layers match random_ltd_layer_id "
                         f"{sorted(wanted)} (wrapped: {wrapped[:8]}"
                         f"{' ...' if len(wrapped) > 8 else ''}); call convert_to_random_ltd "
                         "with the model's layer class and list the layer indices to drop in")
    return count


def has_random_ltd_layers(module: Module) -> bool:
    return any(isinstance(m, RandomLayerTokenDrop) for m in module.modules())


def remove_random_ltd_state_dict(state_dict: dict) -> OrderedDict:
    """The names the model has without the wrappers (``h.1.random_ltd_layer.attn`` ->
    ``h.1.attn``)."""
    return OrderedDict((k.replace(WRAPPED, ""), v) for k, v in state_dict.items())


def save_without_random_ltd(model) -> OrderedDict:
    """The model's state dict under its unwrapped names (to load into the plain model)."""
    return remove_random_ltd_state_dict(_inner(model).state_dict())


def with_random_ltd_names(state_dict: dict, module: Module) -> dict:
    """``state_dict`` written without the wrappers (DeepSpeed's and dslaunch's checkpoints),
    renamed to the wrapped ``module``'s names; unchanged when the names already fit."""
    wrapped = {re.sub(re.escape(WRAPPED), "", k): k for k in module.state_dict()
               if WRAPPED in k}
    if not wrapped:
        return state_dict
    return type(state_dict)((wrapped.get(k, k), v) for k, v in state_dict.items())
