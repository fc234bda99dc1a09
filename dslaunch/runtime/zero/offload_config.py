"""``dslaunch.runtime.zero.offload_config``, as DeepSpeed's: ``OffloadDeviceEnum`` and
``OffloadStateTypeEnum``.

A face: the implementation is ``dslaunch/config/enums.py``.
"""

from dslaunch.config.enums import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
