"""The process groups of this job's parallel layout, under the names of DeepSpeed's private
``deepspeed.utils.groups`` accessors (Transformers and Accelerate call
``_get_sequence_parallel_*``; public as ``dslaunch.utils.groups``).

The layout is the one the last ``dslaunch.initialize`` was given: a PipelineModule's grid or the
``mpu`` (a ``topology.ProcessGrid`` or a Megatron-style object), recorded by ``set_layout``.
Without one (plain data parallel) the data-parallel group is the world, and each axis the job
does not have (model / tensor, pipe, sequence) is a group of this rank alone: size 1, rank 0.
Sequence parallelism (Ulysses): the grid ``initialize`` builds for ``sequence_parallel_size``, or
the mpu's ``get_sequence_parallel_group``; the sequence x data group is the ranks that hold the
same weights. Expert-parallel groups (MoE) are in expert_groups.py. Every accessor needs torch.distributed
initialised, as DeepSpeed's do.
"""

from __future__ import annotations

import torch.distributed as dist

_LAYOUT = None  # the mpu / grid of the last engine, or None (plain data parallel)
_SELF_GROUPS: dict = {}  # id(world group) -> the group of this rank alone


def set_layout(mpu) -> None:
    """Called by ``dslaunch.initialize`` with the job's grid or mpu (None: plain data parallel)."""
    global _LAYOUT
    _LAYOUT = mpu


def self_group():
    """A group of this rank alone, made once per process group; only this rank takes part in
    making it (``use_local_synchronization``), so it is safe to make on first use."""
    world = dist.group.WORLD
    if dist.get_world_size() == 1:
        return world
    if id(world) not in _SELF_GROUPS:
        _SELF_GROUPS[id(world)] = dist.new_group([dist.get_rank()],
                                                 use_local_synchronization=True)
    return _SELF_GROUPS[id(world)]


def _ask(*names):
    """The first of ``names`` the layout answers (called), or None."""
    for name in names:
        fn = getattr(_LAYOUT, name, None)
        if fn is not None:
            return fn()
    return None


def _or(value, default):
    return default() if value is None else value


# -- data parallel --------------------------------------------------------------------------------

def _get_data_parallel_group():
    return _or(_ask("get_data_parallel_group"), lambda: dist.group.WORLD)


def _get_data_parallel_world_size() -> int:
    return _or(_ask("get_data_parallel_world_size"), dist.get_world_size)


def _get_data_parallel_rank() -> int:
    return _or(_ask("get_data_parallel_rank"), dist.get_rank)


# -- model (tensor) parallel ----------------------------------------------------------------------

def _get_model_parallel_group():
    return _or(_ask("get_model_parallel_group", "get_tensor_model_parallel_group"), self_group)


def _get_model_parallel_world_size() -> int:
    return _or(_ask("get_model_parallel_world_size", "get_tensor_model_parallel_world_size"),
               lambda: 1)


def _get_model_parallel_rank() -> int:
    return _or(_ask("get_model_parallel_rank", "get_tensor_model_parallel_rank"), lambda: 0)


def _get_tensor_model_parallel_group():
    return _or(_ask("get_tensor_model_parallel_group"), _get_model_parallel_group)


def _get_tensor_model_parallel_world_size() -> int:
    return _or(_ask("get_tensor_model_parallel_world_size"), _get_model_parallel_world_size)


def tensor_model_parallel_rank() -> int:
    """This rank's place in its tensor-parallel group (0 without one)."""
    return _or(_ask("get_tensor_model_parallel_rank"), _get_model_parallel_rank)


_get_tensor_model_parallel_rank = tensor_model_parallel_rank  # DeepSpeed's name (the face's)


# -- pipeline parallel ----------------------------------------------------------------------------

def _get_pipe_parallel_group():
    return _or(_ask("get_pipe_parallel_group", "get_pipeline_model_parallel_group"), self_group)


def _get_pipe_parallel_world_size() -> int:
    return _or(_ask("get_pipe_parallel_world_size", "get_pipeline_model_parallel_world_size"),
               lambda: 1)


def _get_pipe_parallel_rank() -> int:
    return _or(_ask("get_pipe_parallel_rank", "get_pipeline_model_parallel_rank"), lambda: 0)


# -- sequence parallel (Ulysses) -------------------------------------------------------------------

def _get_sequence_parallel_group():
    return _or(_ask("get_sequence_parallel_group"), self_group)


def _get_sequence_parallel_world_size() -> int:
    return _or(_ask("get_sequence_parallel_world_size"), lambda: 1)


def _get_sequence_parallel_rank() -> int:
    return _or(_ask("get_sequence_parallel_rank"), lambda: 0)


def _get_sequence_data_parallel_group():
    """Ranks that share the model's weights across sequence and data parallelism: the
    data-parallel group when there is no sequence parallelism."""
    return _or(_ask("get_sequence_data_parallel_group"), _get_data_parallel_group)


def _get_sequence_data_parallel_world_size() -> int:
    return _or(_ask("get_sequence_data_parallel_world_size"), _get_data_parallel_world_size)


def _get_sequence_data_parallel_rank() -> int:
    return _or(_ask("get_sequence_data_parallel_rank"), _get_data_parallel_rank)
