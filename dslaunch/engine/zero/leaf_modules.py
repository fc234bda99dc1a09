"""ZeRO-3 leaf modules (DeepSpeed's ``set_z3_leaf_modules``; public in ``dslaunch.utils``).

A leaf module is gathered whole, all its descendants' parameters at once, as one fetch unit
(``stage3_units.py``), and its descendants get no hooks of their own. That is what a mixture-of-
experts block needs: its router picks different experts on every rank, so per-expert gathering
would issue different collectives on different ranks. Mark the classes before
``dslaunch.initialize``: stage 3 plans its units when it is built.
"""

from __future__ import annotations

import torch

# DeepSpeed's attribute name: code that reads the mark directly keeps working
LEAF_ATTR = "_z3_leaf"


def _matches(module: torch.nn.Module, classes) -> bool:
    return any(module.__class__.__name__ == c if isinstance(c, str) else isinstance(module, c)
               for c in classes)


def _mark(model, leaf_module_classes, flag: bool, raise_if_not_found: bool) -> list:
    classes = list(leaf_module_classes)
    found = [m for m in model.modules() if _matches(m, classes)]
    if not found and raise_if_not_found:
        names = [c if isinstance(c, str) else c.__name__ for c in classes]
        raise ValueError(f"no module of class {names} in the model")
    for m in found:
        setattr(m, LEAF_ATTR, flag)
    return found


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes,
                        raise_if_not_found: bool = True) -> list:
    """Mark every module of ``model`` whose class is in ``leaf_module_classes`` (classes, or
    class names as strings) a ZeRO-3 leaf; returns the marked modules."""
    return _mark(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes,
                          raise_if_not_found: bool = True) -> list:
    """Undo ``set_z3_leaf_modules`` for those classes; returns the modules unmarked."""
    return _mark(model, leaf_module_classes, False, raise_if_not_found)


def z3_leaf_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` is marked a ZeRO-3 leaf."""
    return bool(getattr(module, LEAF_ATTR, False))


def get_z3_leaf_modules(model: torch.nn.Module) -> list:
    """The modules of ``model`` marked ZeRO-3 leaves."""
    return [m for m in model.modules() if z3_leaf_module(m)]
