"""``dslaunch.utils.zero_to_fp32``, as ``deepspeed.utils.zero_to_fp32``: a dslaunch checkpoint
(ZeRO 0-3 or pipeline / tensor parallel) as one fp32 state_dict, in memory, in a file or loaded
into a model. Without dslaunch installed, run the ``zero_to_fp32.py`` that ``save_checkpoint``
writes beside the checkpoints.

A face: the implementation is ``dslaunch/engine/checkpoint/fp32_state.py`` (and
``state_files.py`` for the two file finders).
"""

from dslaunch.engine.checkpoint.fp32_state import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)
from dslaunch.engine.checkpoint.state_files import get_model_state_file, get_optim_files

__all__ = ["get_fp32_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint",
           "get_model_state_file", "get_optim_files"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
