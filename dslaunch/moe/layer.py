"""``dslaunch.moe.layer``, as ``deepspeed.moe.layer``: the ``MoE`` layer. A face: the
implementation is ``dslaunch/engine/parallel/moe/layer.py``."""

from dslaunch.engine.parallel.moe.layer import MoE  # noqa: F401
