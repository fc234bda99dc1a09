"""``dslaunch.compression.compress``, as ``deepspeed.compression.compress``: ``init_compression``
and ``redundancy_clean``. A face: the implementation is ``dslaunch/engine/features/compression/compress.py``.
"""

from dslaunch.engine.features.compression.compress import get_module_name, init_compression, redundancy_clean

__all__ = ["init_compression", "redundancy_clean", "get_module_name"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
