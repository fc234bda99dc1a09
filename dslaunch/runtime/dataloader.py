"""``dslaunch.runtime.dataloader``, as ``deepspeed.runtime.dataloader``: ``RepeatingLoader`` (the
same class as ``dslaunch.utils.RepeatingLoader``; Megatron-DeepSpeed imports it from here).

A face: the implementation is ``dslaunch/engine/base/dataloader.py``.
"""

from dslaunch.engine.base.dataloader import RepeatingLoader

__all__ = ["RepeatingLoader"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
