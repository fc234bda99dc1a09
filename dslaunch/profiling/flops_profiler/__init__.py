"""``dslaunch.profiling.flops_profiler``, as ``deepspeed.profiling.flops_profiler``: per-module
forward FLOPs, MACs, parameters and latency. A face: the implementation is
``dslaunch/engine/observe/profiling/flops_profiler.py`` over ``counting.py`` (ATen-level counting)."""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.engine.observe.profiling.flops_profiler import (
    FlopsProfiler,
    bytes_to_string,
    duration_to_string,
    flops_to_string,
    get_model_profile,
    get_module_duration,
    get_module_flops,
    get_module_macs,
    macs_to_string,
    number_to_string,
    params_to_string,
)

__all__ = ["FlopsProfiler", "get_model_profile", "get_module_flops", "get_module_macs",
           "get_module_duration", "number_to_string", "macs_to_string", "flops_to_string",
           "bytes_to_string", "params_to_string", "duration_to_string"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
