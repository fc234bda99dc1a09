"""``dslaunch.zero``, as ``deepspeed.zero``: build a model already partitioned (``Init``), make
partitioned parameters whole for a block (``GatheredParameters``), declare a parameter a module
reads but does not own (``register_external_parameter``), cut a huge Linear into tiles that ZeRO-3
gathers one at a time (``TiledLinear``).

A face: the implementations are ``dslaunch/engine/zero/zero_init.py`` and ``tiled_linear.py``.
"""

from dslaunch.engine.zero.tiled_linear import TiledLinear
from dslaunch.engine.zero.zero_init import (
    GatheredParameters,
    Init,
    register_external_parameter,
    unregister_external_parameter,
)

__all__ = ["Init", "GatheredParameters", "register_external_parameter",
           "unregister_external_parameter", "TiledLinear"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
