"""``dslaunch.runtime.sequence_parallel``, as ``deepspeed.runtime.sequence_parallel``."""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
