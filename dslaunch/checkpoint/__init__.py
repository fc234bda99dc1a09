"""``dslaunch.checkpoint``, as ``deepspeed.checkpoint``: ``utils.clone_tensors_for_torch_save``.
DeepSpeed's universal-checkpoint names are not provided (see docs/porting.md).

A face: the checkpoint room is ``dslaunch/engine/checkpoint/`` (its ``__init__`` maps it).
"""

from dslaunch.deepspeed_names import face_getattr

from . import utils

__all__ = ["utils"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
