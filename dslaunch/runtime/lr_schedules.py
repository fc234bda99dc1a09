"""``dslaunch.runtime.lr_schedules``, as ``deepspeed.runtime.lr_schedules``: the schedule classes
and ``VALID_LR_SCHEDULES`` (their names; Accelerate recognises a DeepSpeed scheduler by it).

A face: the implementation is ``dslaunch/engine/optim/schedules.py``.
"""

from dslaunch.engine.optim.schedules import (
    VALID_LR_SCHEDULES,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)

__all__ = ["VALID_LR_SCHEDULES", "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
           "WarmupCosineLR"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
