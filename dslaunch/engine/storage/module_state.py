"""A checkpoint's module state against the model: the names and shapes checked before anything
is loaded (``check_module``), and the frozen parameters left out of a save (``without_frozen``)."""

from __future__ import annotations

import torch

from dslaunch.engine.storage.files import CheckpointError


def without_frozen(state: dict, module: torch.nn.Module) -> dict:
    """``state`` without the module's frozen parameters (``exclude_frozen_parameters``: a PEFT
    adapter's checkpoint holds only what trains; load it with ``load_module_strict=False``)."""
    frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
    return {k: v for k, v in state.items() if k not in frozen}


def check_module(sd: dict, model: torch.nn.Module, path: str, strict: bool,
                 shapes: dict | None = None) -> None:
    """Raise naming the first tensor whose name or shape does not match the model (``shapes``:
    the real shapes of placeholders, ``zero3_module.py``)."""
    own = model.state_dict()
    shapes = shapes or {}
    for name, t in own.items():
        if name not in sd:
            if strict:
                raise CheckpointError(f"{path}: model tensor {name!r} is missing from the "
                                      "checkpoint")
            continue
        shape = shapes.get(name, tuple(sd[name].shape))
        if tuple(shape) != tuple(t.shape):
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(shape)} in "
                                  f"the checkpoint but {list(t.shape)} in the model")
    if strict:
        for name in sd:
            if name not in own:
                raise CheckpointError(f"{path}: checkpoint tensor {name!r} does not exist in the "
                                      "model")
