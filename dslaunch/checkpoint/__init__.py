"""``dslaunch.checkpoint``, as ``deepspeed.checkpoint``: ``utils.clone_tensors_for_torch_save``.
DeepSpeed's universal-checkpoint names are not provided (see docs/porting.md).

A face: the checkpoint room is ``dslaunch/engine/checkpoint/`` (its ``__init__`` maps it).
"""

from . import utils

__all__ = ["utils"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
