"""``dslaunch.compression``, as ``deepspeed.compression`` (DeepSpeed 0.18; 0.19 removed it):
``init_compression``, ``redundancy_clean`` and ``compression_scheduler`` for weight and
activation quantization, sparse / row / head / channel pruning and layer reduction. A face: the
implementation is ``dslaunch/engine/features/compression/``.
"""

from dslaunch.engine.features.compression import compression_scheduler, init_compression, redundancy_clean

__all__ = ["init_compression", "redundancy_clean", "compression_scheduler"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import face_getattr

    return face_getattr(__name__)(name)
