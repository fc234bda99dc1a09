"""``dslaunch.moe.experts``, as ``deepspeed.moe.experts``. A face: the implementation is
``dslaunch/engine/parallel/moe/experts.py``."""

from dslaunch.engine.parallel.moe.experts import Experts  # noqa: F401
