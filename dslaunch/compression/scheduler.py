"""``dslaunch.compression.scheduler``, as ``deepspeed.compression.scheduler``: the
``compression_scheduler`` the engine steps. A face: the implementation is
``dslaunch/engine/features/compression/scheduler.py``.
"""

from dslaunch.engine.features.compression.scheduler import compression_scheduler

__all__ = ["compression_scheduler"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
