"""``dslaunch.runtime.pipe.engine``, as ``deepspeed.runtime.pipe.engine``: ``PipelineEngine``.

A face: the implementation is ``dslaunch/engine/core/pipe_engine.py``.
"""

from dslaunch.engine.core.pipe_engine import PipelineEngine

__all__ = ["PipelineEngine"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
