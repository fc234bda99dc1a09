"""dslaunch: a launcher and training runtime for large PyTorch models.

The public training API mirrors DeepSpeed's (``initialize``, ``init_distributed``,
``add_config_arguments``, ``DeepSpeedEngine``, ``pipe``, ``zero``, ...) so a DeepSpeed script ports
by changing one import. Which DeepSpeed names answer, and from where, is the table in
``deepspeed_names.py``. Everything here is imported lazily: the launcher and the CLI never pay for
importing torch.
"""

from dslaunch.missing_modules import install_finder as _install_finder

__version__ = "0.1.0"

_OWN = {"DSLaunchEngine": "dslaunch.engine.core.engine:DSLaunchEngine",  # our names, not DeepSpeed's
        "StepAbandoned": "dslaunch.engine.comm.membership:StepAbandoned"}

_install_finder()  # `import dslaunch.moe` says which issue brings it


def __getattr__(name):
    import importlib

    _names = importlib.import_module("dslaunch.deepspeed_names")
    if name in _OWN:
        module, _, attr = _OWN[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    found = _names.BY_NAME.get(f"deepspeed.{name}")
    if found is not None and found.present:
        return _names.resolve(found)
    if found is not None or name.startswith("__"):
        raise _names.missing_attribute("dslaunch", name) if found else AttributeError(name)
    raise AttributeError(f"module 'dslaunch' has no attribute {name!r}")
