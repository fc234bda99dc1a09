"""``dslaunch.comm``, as ``deepspeed.comm``: process groups, collectives and point-to-point calls
with torch.distributed's semantics, booked in the same table as the engine's own collectives (so
``engine.comm_stats()`` and ``log_summary()`` count the script's calls too).

A face: the implementation is ``dslaunch/engine/comm/api.py`` over ``dslaunch/engine/comm/collectives.py``.
"""

from dslaunch.engine.comm.api import (
    ProcessGroup,
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    allgather_fn,
    barrier,
    broadcast,
    configure,
    destroy_process_group,
    gather,
    get_backend,
    get_comm_operation_count,
    get_global_rank,
    get_local_rank,
    get_logged_comm_ops,
    get_rank,
    get_world_size,
    has_all_gather_into_tensor,
    has_comm_data,
    has_reduce_scatter_tensor,
    inference_all_reduce,
    init_distributed,
    irecv,
    is_available,
    is_initialized,
    isend,
    log_summary,
    monitored_barrier,
    new_group,
    recv,
    reduce,
    reduce_scatter_fn,
    reduce_scatter_tensor,
    reset_log,
    scatter,
    send,
)
from dslaunch.engine.observe.comms_logger import COMMS_LOGGER as comms_logger

__all__ = ["init_distributed", "is_initialized", "is_available", "get_rank", "get_world_size",
           "get_local_rank", "get_global_rank", "new_group", "get_backend",
           "destroy_process_group", "barrier", "monitored_barrier", "all_reduce",
           "inference_all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "allgather_fn", "reduce_scatter_tensor", "reduce_scatter_fn", "all_to_all_single",
           "gather", "scatter", "send", "recv", "isend", "irecv", "ReduceOp", "ProcessGroup",
           "has_all_gather_into_tensor", "has_reduce_scatter_tensor", "log_summary",
           "configure", "reset_log", "has_comm_data", "get_comm_operation_count",
           "get_logged_comm_ops", "comms_logger"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
