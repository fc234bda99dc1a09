"""``dslaunch.checkpointing``, as ``deepspeed.checkpointing`` (and
``deepspeed.runtime.activation_checkpointing.checkpointing``): activation checkpointing
(``configure``, ``checkpoint``, ``is_configured``, ``reset``) and the model-parallel random state
(``get_cuda_rng_tracker``, ``model_parallel_cuda_manual_seed``).

A face: the implementation is ``dslaunch/engine/features/activation_checkpoint.py``; its module state
(``PARTITION_ACTIVATIONS``, ``mp_size``, ...) reads through this module as it is now.
"""

from dslaunch.engine.features import activation_checkpoint as _impl
from dslaunch.engine.features.activation_checkpoint import (
    CheckpointFunction,
    CudaRNGStatesTracker,
    checkpoint,
    configure,
    get_cuda_rng_tracker,
    is_activation_to_checkpoint,
    is_configured,
    model_parallel_cuda_manual_seed,
    model_parallel_reconfigure_tp_seed,
    partition_activations_in_checkpoint,
    reset,
    set_num_layers,
)

__all__ = ["configure", "checkpoint", "is_configured", "reset", "get_cuda_rng_tracker",
           "model_parallel_cuda_manual_seed", "model_parallel_reconfigure_tp_seed",
           "CudaRNGStatesTracker", "CheckpointFunction", "partition_activations_in_checkpoint",
           "set_num_layers", "is_activation_to_checkpoint"]


def __getattr__(name):  # the module state, as it is now; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
