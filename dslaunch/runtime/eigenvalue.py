"""``dslaunch.runtime.eigenvalue``, as ``deepspeed.runtime.eigenvalue``: per-block dominant
Hessian eigenvalues by power iteration. A face: the implementation is
``dslaunch/engine/features/eigenvalue.py``.
"""

from dslaunch.engine.features.eigenvalue import Eigenvalue

__all__ = ["Eigenvalue"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
