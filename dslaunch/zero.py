"""``dslaunch.zero``, as ``deepspeed.zero``: build a model already partitioned (``Init``), make
partitioned parameters whole for a block (``GatheredParameters``), declare a parameter a module
reads but does not own (``register_external_parameter``).

A face: the implementation is ``dslaunch/engine/zero/zero_init.py``.
"""

from dslaunch.engine.zero.zero_init import (
    GatheredParameters,
    Init,
    register_external_parameter,
    unregister_external_parameter,
)

__all__ = ["Init", "GatheredParameters", "register_external_parameter",
           "unregister_external_parameter"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
