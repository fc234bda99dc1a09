"""``dslaunch.moe``, as ``deepspeed.moe``: mixture of experts with expert parallelism
(``moe.layer.MoE``, ``moe.sharded_moe``'s gates, ``moe.experts.Experts``, ``moe.utils``'s
parameter groups). A face: the implementation is ``dslaunch/engine/parallel/moe/``."""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
