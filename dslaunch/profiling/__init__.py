"""``dslaunch.profiling``, as ``deepspeed.profiling``: the FLOPs profiler
(``dslaunch.profiling.flops_profiler``). A face: the implementation is ``dslaunch/engine/observe/profiling/``."""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
