"""``dslaunch.runtime.engine``, as ``deepspeed.runtime.engine``: the engine class
(``DeepSpeedEngine`` is dslaunch's ``DSLaunchEngine``, so isinstance checks hold).

A face: the implementation is ``dslaunch/engine/core/engine.py``.
"""

from dslaunch.engine.core.engine import DSLaunchEngine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
