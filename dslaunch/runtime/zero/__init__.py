"""``dslaunch.runtime.zero``, as ``deepspeed.runtime.zero``: ``GatheredParameters`` and ``Init``
(the same objects as ``dslaunch.zero``), and the ``partition_parameters`` and
``offload_config`` submodules.

A face: the implementation is ``dslaunch/engine/zero/``.
"""

from dslaunch.engine.zero.zero_init import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]

_SUBMODULES = ("offload_config", "partition_parameters")


def __getattr__(name):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
