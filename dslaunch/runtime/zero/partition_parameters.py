"""``dslaunch.runtime.zero.partition_parameters``, as DeepSpeed's: ``ZeroParamStatus`` (the
``ds_status`` of a ZeRO-3 parameter), ``Init``, ``GatheredParameters``.

A face: the implementation is ``dslaunch/engine/zero/param_status.py`` and ``zero_init.py``.
"""

from dslaunch.engine.zero.param_status import ZeroParamStatus
from dslaunch.engine.zero.zero_init import GatheredParameters, Init

__all__ = ["ZeroParamStatus", "Init", "GatheredParameters"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
