"""``dslaunch.moe.experts``, as ``deepspeed.moe.experts``. A face: the implementation is
``dslaunch/engine/moe/experts.py``."""

from dslaunch.engine.moe.experts import Experts  # noqa: F401
