"""``dslaunch.runtime.base_optimizer``, as ``deepspeed.runtime.base_optimizer``: the
``DeepSpeedOptimizer`` class frameworks test optimizers against (Lightning Fabric).

A face: the class is ``dslaunch/engine/core/deepspeed_surface.py``'s.
"""

from dslaunch.engine.core.deepspeed_surface import DeepSpeedOptimizer

__all__ = ["DeepSpeedOptimizer"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
