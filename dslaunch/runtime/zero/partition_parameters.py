"""``dslaunch.runtime.zero.partition_parameters``, as DeepSpeed's: ``ZeroParamStatus`` (the
``ds_status`` of a ZeRO-3 parameter), ``Init``, ``GatheredParameters``, and the module globals
Transformers patches around ``zero.Init``.

A face: the implementation is ``dslaunch/engine/zero/param_status.py``, ``zero_init.py`` and
``init_hooks.py``.
"""

from dslaunch.engine.zero.init_hooks import (
    _orig_torch_arange,
    get_accelerator,
    zero_wrapper_for_fp_tensor_constructor,
)
from dslaunch.engine.zero.param_status import ZeroParamStatus
from dslaunch.engine.zero.zero_init import GatheredParameters, Init

__all__ = ["ZeroParamStatus", "Init", "GatheredParameters", "_orig_torch_arange", "get_accelerator",
           "zero_wrapper_for_fp_tensor_constructor"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
