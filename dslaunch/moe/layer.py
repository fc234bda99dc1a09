"""``dslaunch.moe.layer``, as ``deepspeed.moe.layer``: the ``MoE`` layer. A face: the
implementation is ``dslaunch/engine/moe/layer.py``."""

from dslaunch.engine.moe.layer import MoE  # noqa: F401
