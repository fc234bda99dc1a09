"""``dslaunch.runtime.utils``, as ``deepspeed.runtime.utils``: ``see_memory_usage``,
``set_random_seed``, ``move_to_device``.

A face: the implementation is ``dslaunch/engine/base/runtime_utils.py``.
"""

from dslaunch.engine.base.runtime_utils import move_to_device, see_memory_usage, set_random_seed

__all__ = ["see_memory_usage", "set_random_seed", "move_to_device"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
