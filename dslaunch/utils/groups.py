"""``dslaunch.utils.groups``, as ``deepspeed.utils.groups``: DeepSpeed's private accessors of the
data / model (tensor) / pipeline / sequence parallel groups, answered from the layout of the last
``dslaunch.initialize`` (its PipelineModule's grid or mpu; the world group for plain data
parallelism, a one-rank group for an axis the job does not have; the sequence axis of
``sequence_parallel_size``). Expert parallelism comes with issue 22.

A face: the implementation is ``dslaunch/engine/parallel_groups.py``.
"""

from dslaunch.engine.parallel_groups import (  # noqa: F401
    _get_data_parallel_group,
    _get_data_parallel_rank,
    _get_data_parallel_world_size,
    _get_model_parallel_group,
    _get_model_parallel_rank,
    _get_model_parallel_world_size,
    _get_pipe_parallel_group,
    _get_pipe_parallel_rank,
    _get_pipe_parallel_world_size,
    _get_sequence_data_parallel_group,
    _get_sequence_data_parallel_rank,
    _get_sequence_data_parallel_world_size,
    _get_sequence_parallel_group,
    _get_sequence_parallel_rank,
    _get_sequence_parallel_world_size,
    _get_tensor_model_parallel_group,
    _get_tensor_model_parallel_rank,
    _get_tensor_model_parallel_world_size,
)


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
