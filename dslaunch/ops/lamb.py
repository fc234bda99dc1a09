"""``dslaunch.ops.lamb``, as ``deepspeed.ops.lamb``: ``FusedLamb`` (LAMB in torch ops, any
device; no compiled op).

A face: the implementation is ``dslaunch/engine/optim/lamb.py``.
"""

from dslaunch.engine.optim.lamb import Lamb as FusedLamb

__all__ = ["FusedLamb"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
