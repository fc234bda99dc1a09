"""``dslaunch.utils.logging``, as ``deepspeed.utils.logging``: the one ``"dslaunch"`` logger
(``logger.setLevel`` quiets it) and ``log_dist``.

A face: the implementation is ``dslaunch/engine/base/log.py``.
"""

from dslaunch.engine.base.log import log_dist, logger

__all__ = ["logger", "log_dist"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
