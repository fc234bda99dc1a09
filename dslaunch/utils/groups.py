"""``dslaunch.utils.groups``, as ``deepspeed.utils.groups``: DeepSpeed's private accessors of the
data / model (tensor) / pipeline / sequence parallel groups, answered from the layout of the last
``dslaunch.initialize`` (its PipelineModule's grid or mpu; the world group for plain data
parallelism, a one-rank group for an axis the job does not have; the sequence axis of
``sequence_parallel_size``). The expert-parallel groups of MoE layers (``ep_size_{N}``, made by
``_create_expert_and_data_parallel``) have DeepSpeed's names, rank layout and semantics.

A face: the implementations are ``dslaunch/engine/parallel/groups.py`` and
``dslaunch/engine/parallel/expert_groups.py``.
"""

from dslaunch.engine.parallel.expert_groups import (  # noqa: F401
    _create_expert_and_data_parallel,
    _create_expert_data_and_model_parallel,
    _get_expert_broadcast_src_rank,
    _get_expert_data_parallel_group,
    _get_expert_data_parallel_group_dict,
    _get_expert_data_parallel_group_ranks,
    _get_expert_data_parallel_rank,
    _get_expert_data_parallel_world_size,
    _get_expert_model_parallel_world_size,
    _get_expert_parallel_group,
    _get_expert_parallel_group_dict,
    _get_expert_parallel_group_ranks,
    _get_expert_parallel_rank,
    _get_expert_parallel_ranks,
    _get_expert_parallel_src_rank,
    _get_expert_parallel_world_size,
    _get_max_expert_parallel_group,
    _get_max_expert_size,
    _get_max_expert_size_name,
)
from dslaunch.engine.parallel.groups import (  # noqa: F401
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
    if name == "mpu":  # DeepSpeed's groups.mpu: the layout the last initialize was given
        from dslaunch.engine.parallel import groups as parallel_groups

        return parallel_groups._LAYOUT
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
