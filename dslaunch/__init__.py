"""dslaunch: a launcher and training runtime for large PyTorch models.

The public training API mirrors DeepSpeed's (``initialize``, ``init_distributed``,
``add_config_arguments``, ``pipe``, ``zero``) so a DeepSpeed script ports by changing one import.
Everything here is imported lazily: the launcher and the CLI never pay for importing torch.
"""

__version__ = "0.1.0"

_LAZY = {
    "initialize": ("dslaunch.engine.api", "initialize"),
    "init_distributed": ("dslaunch.engine.api", "init_distributed"),
    "add_config_arguments": ("dslaunch.engine.api", "add_config_arguments"),
    "DSLaunchEngine": ("dslaunch.engine.engine", "DSLaunchEngine"),
}


_LAZY_MODULES = {"pipe", "zero"}  # dslaunch.pipe / dslaunch.zero, as deepspeed.pipe / deepspeed.zero


def __getattr__(name):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f"dslaunch.{name}")
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'dslaunch' has no attribute {name!r}")
