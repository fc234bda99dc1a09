"""``dslaunch.ops.adam``, as ``deepspeed.ops.adam``: ``DeepSpeedCPUAdam`` (the compiled CPU Adam,
for CPU parameters; torch fallback with one warning when the op cannot be built, ``.compiled``
says which) and ``FusedAdam`` (the compiled CPU Adam for CPU parameters, torch's fused Adam /
AdamW kernel on CUDA).

A face: the implementation is ``dslaunch/engine/optim/cpu_adam.py`` and ``fused.py``.
"""

from dslaunch.engine.optim.cpu_adam import DSCPUAdam as DeepSpeedCPUAdam
from dslaunch.engine.optim.fused import FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
