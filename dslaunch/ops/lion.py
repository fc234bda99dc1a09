"""``dslaunch.ops.lion``, as ``deepspeed.ops.lion``: ``DeepSpeedCPULion`` (the compiled CPU Lion,
for CPU parameters; torch fallback when the op cannot be built) and ``FusedLion`` (the compiled
CPU Lion for CPU parameters, torch ops on CUDA).

A face: the implementation is ``dslaunch/engine/optim/cpu_adam.py`` and ``fused.py``.
"""

from dslaunch.engine.optim.cpu_adam import DSCPULion as DeepSpeedCPULion
from dslaunch.engine.optim.fused import FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
