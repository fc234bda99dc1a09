"""``dslaunch.checkpoint.utils``, as ``deepspeed.checkpoint.utils``:
``clone_tensors_for_torch_save`` (copies of a state's tensors, to save them alone).

A face: the implementation is ``dslaunch/engine/storage/clone.py``.
"""

from dslaunch.engine.storage.clone import clone_tensors_for_torch_save

__all__ = ["clone_tensors_for_torch_save"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
