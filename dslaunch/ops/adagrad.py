"""``dslaunch.ops.adagrad``, as ``deepspeed.ops.adagrad``: ``DeepSpeedCPUAdagrad`` (the compiled
CPU Adagrad, for CPU parameters; torch fallback when the op cannot be built).

A face: the implementation is ``dslaunch/engine/optim/cpu_adam.py``.
"""

from dslaunch.engine.optim.cpu_adam import DSCPUAdagrad as DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
