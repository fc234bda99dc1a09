"""``dslaunch.runtime.zero``, as ``deepspeed.runtime.zero``: ``GatheredParameters`` and ``Init``
(the same objects as ``dslaunch.zero``), and the ``partition_parameters`` and
``offload_config`` submodules.

A face: the implementation is ``dslaunch/engine/zero/``.
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.engine.zero.zero_init import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
