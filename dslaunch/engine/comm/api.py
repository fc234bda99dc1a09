"""DeepSpeed's ``deepspeed.comm`` functions (the face is ``dslaunch/comm.py``), each booked in the
accounting of ``comm.py``, so that a script's own collectives show up in ``engine.comm_stats()``.

The record: one ``Comm`` per process group on this process books that group's collectives. An
engine makes its ``Comm`` the record of its group when it is built (``record_comm``: the world for
plain data parallelism, the mpu's data group with tensor or pipeline parallelism), so the engine
and the script book into one table; the latest engine built on a group wins. A group no engine
uses gets a ``Comm`` of its own on its first collective. ``log_summary`` prints every record.

Semantics are torch.distributed's, as DeepSpeed's torch backend passes them through: ``src`` and
``dst`` are global ranks, a synchronous call returns what torch returns (None, or the sender's rank
for ``recv``), ``async_op=True`` (and ``isend`` / ``irecv``) returns a handle whose ``wait()`` also
books the time waited. On a rank outside ``group`` a call does what torch does there (nothing) and
books nothing. ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` take the engine's gloo
paths (``DSLAUNCH_GLOO_COLLECTIVES``, see ``comm.py``): same results, fewer seconds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dslaunch.engine.comm.collectives import Comm, all_gather_single, init_distributed, local_rank  # noqa: F401
from dslaunch.engine.observe.comms_logger import COMMS_LOGGER, configure  # noqa: F401  (deepspeed.comm.configure)

# torch's own objects: DeepSpeed's ReduceOp members have the same names (SUM, MAX, ...)
ReduceOp = dist.ReduceOp
ProcessGroup = dist.ProcessGroup
is_available = dist.is_available
is_initialized = dist.is_initialized
get_rank = dist.get_rank
get_world_size = dist.get_world_size
new_group = dist.new_group
get_local_rank = local_rank



def backend_name(torch_backend: str, device_type: str) -> str:
    """The one backend name a ``device_type`` tensor meets in a group torch reports as
    ``torch_backend``: ``"cpu:gloo,cuda:nccl"`` -> ``"nccl"`` for ``"cuda"``, ``"gloo"`` for
    ``"cpu"``; a plain name (``"gloo"``, ``"nccl"``) as it is. A device the per-device form does not
    name gets the first backend listed."""
    torch_backend = str(torch_backend)
    if ":" not in torch_backend:
        return torch_backend
    pairs = dict(part.split(":", 1) for part in torch_backend.split(","))
    return pairs.get(device_type, next(iter(pairs.values())))


def get_backend(group=None) -> str:
    """The group's backend name for the accelerator's device: ``"nccl"`` where the default
    device is CUDA, ``"gloo"`` on the CPU. dslaunch makes its NCCL groups as
    ``cpu:gloo,cuda:nccl`` (``comm.with_cpu_backend``), which torch's ``get_backend`` answers
    verbatim; DeepSpeed initialises with the accelerator's ``communication_backend_name()`` alone,
    so its ``cdb.get_backend()`` (``comm/torch.py``: torch's answer) says ``"nccl"`` there, and
    scripts compare with that."""
    from dslaunch.accelerator import get_accelerator

    device_type = get_accelerator().device_name().split(":", 1)[0]
    return backend_name(dist.get_backend(group), device_type)


# -- the record --------------------------------------------------------------------------------

_RECORDS: dict = {}  # process group (the world's default group for None) -> its booking Comm


def _key(group):
    return dist.group.WORLD if group is None else group


def record_comm(comm: Comm) -> None:
    """Make ``comm`` the record of its group: dslaunch.comm's calls on that group book into its
    table from now on (called by every engine with its own Comm)."""
    if dist.is_initialized():
        _RECORDS[_key(comm.group)] = comm


def recorded_comm(group=None) -> Comm | None:
    """The Comm booking ``group``'s collectives on this process (made on first use); None on a
    rank outside ``group``."""
    if group is dist.group.WORLD:
        group = None
    comm = _RECORDS.get(_key(group))
    if comm is None:
        if dist.get_rank(group) < 0:
            return None
        comm = _RECORDS[_key(group)] = Comm(group)
    return comm


def _booked(name: str, nbytes: int, group, call, async_op=False, path=None):
    """``call(async_op)`` booked as ``name`` with ``nbytes`` of payload in ``group``'s record."""
    comm = recorded_comm(group)
    if comm is None:
        return call(async_op)
    return comm._run(name, nbytes, call, async_op, path=path)


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# -- collectives ---------------------------------------------------------------------------------

def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    comm = recorded_comm(group)
    if comm is None:
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return comm.all_reduce(tensor, op=op, async_op=async_op)


inference_all_reduce = all_reduce  # DeepSpeed's fused inference kernels do not apply here


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    return _booked("reduce", _nbytes(tensor), group,
                   lambda a: dist.reduce(tensor, dst, op=op, group=group, async_op=a), async_op)


def broadcast(tensor, src, group=None, async_op=False):
    return _booked("broadcast", _nbytes(tensor), group,
                   lambda a: dist.broadcast(tensor, src, group=group, async_op=a), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """The list form: ``tensor_list[r]`` gets rank r's ``tensor``. Booked with the flat form
    under ``all_gather`` (path native: gloo's own)."""
    return _booked("all_gather", _nbytes(tensor), group,
                   lambda a: dist.all_gather(tensor_list, tensor, group=group, async_op=a),
                   async_op, path="native")


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    comm = recorded_comm(group)
    if comm is None:
        return all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
    return comm.all_gather_into_tensor(output_tensor, input_tensor, async_op=async_op)


allgather_fn = all_gather_into_tensor  # DeepSpeed's name that falls back on older torch


def reduce_scatter_tensor(output_tensor, input_tensor, op=ReduceOp.SUM, group=None,
                          async_op=False):
    comm = recorded_comm(group)
    if comm is None:
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)
    return comm.reduce_scatter_tensor(output_tensor, input_tensor, op=op, async_op=async_op)


def reduce_scatter_fn(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """DeepSpeed's name (and argument name) for ``reduce_scatter_tensor``."""
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    return _booked("all_to_all", _nbytes(tensor), group,
                   lambda a: dist.all_to_all_single(output, tensor, output_split_sizes,
                                                    input_split_sizes, group=group, async_op=a),
                   async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    return _booked("gather", _nbytes(tensor), group,
                   lambda a: dist.gather(tensor, gather_list, dst, group=group, async_op=a),
                   async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    return _booked("scatter", _nbytes(tensor), group,
                   lambda a: dist.scatter(tensor, scatter_list, src, group=group, async_op=a),
                   async_op)


def barrier(group=None, async_op=False, device_ids=None):
    return _booked("barrier", 0, group,
                   lambda a: dist.barrier(group=group, async_op=a, device_ids=device_ids),
                   async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch's barrier that names the ranks that did not arrive within ``timeout`` (gloo)."""
    return _booked("monitored_barrier", 0, group,
                   lambda a: dist.monitored_barrier(group=group, timeout=timeout,
                                                    wait_all_ranks=wait_all_ranks))


# -- point to point ------------------------------------------------------------------------------

def send(tensor, dst, group=None, tag=0):
    return _booked("send", _nbytes(tensor), group,
                   lambda a: dist.send(tensor, dst, group=group, tag=tag))


def recv(tensor, src=None, group=None, tag=0):
    """Returns the sender's rank (``src=None`` receives from any rank)."""
    return _booked("recv", _nbytes(tensor), group,
                   lambda a: dist.recv(tensor, src, group=group, tag=tag))


def isend(tensor, dst, group=None, tag=0):
    return _booked("send", _nbytes(tensor), group,
                   lambda a: dist.isend(tensor, dst, group=group, tag=tag), async_op=True)


def irecv(tensor, src=None, group=None, tag=0):
    return _booked("recv", _nbytes(tensor), group,
                   lambda a: dist.irecv(tensor, src, group=group, tag=tag), async_op=True)


# -- groups and capabilities --------------------------------------------------------------------

def get_global_rank(group=None, group_rank=0) -> int:
    """The global rank of ``group_rank`` in ``group`` (itself for the world)."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def destroy_process_group(group=None) -> None:
    """torch's, and forgets the records of the groups it destroys (all of them for the world)."""
    if group is None or group is dist.group.WORLD:
        _RECORDS.clear()
    else:
        _RECORDS.pop(group, None)
    dist.destroy_process_group(group)


def has_all_gather_into_tensor() -> bool:
    return True  # every torch dslaunch supports has it (and the gloo paths emulate it)


def has_reduce_scatter_tensor() -> bool:
    return True


# -- the summary ---------------------------------------------------------------------------------

def _label(group) -> str:
    if group is dist.group.WORLD:
        return "world"
    try:
        return "ranks " + ",".join(str(r) for r in dist.get_process_group_ranks(group))
    except (ValueError, RuntimeError):  # destroyed through torch, behind our back
        return "old group"


def log_summary(show_straggler=False, return_dict=False):
    """Print, on rank 0, the comms logger's table (when it recorded anything: per op and message
    size, count, total and average latency, algorithmic and bus bandwidth, DeepSpeed's) and what
    every record booked on this rank: calls, payload bytes, bytes sent to other ranks, seconds
    (see ``comm.py``). ``return_dict``: also return, on every rank, DeepSpeed's dict
    (``summary``: the logger's table, ``straggler_analysis``: None, ``metadata``) plus
    ``booked``: ``{group label: {collective: record}}``. ``show_straggler``: also DeepSpeed's
    straggler breakdown (each logged call's latency against the smallest any rank saw for it:
    collective, every rank calls it, having logged the same calls), in ``straggler_analysis``."""
    tables = {_label(g): comm.stats() for g, comm in list(_RECORDS.items())}
    logged = COMMS_LOGGER.summary()
    stragglers = COMMS_LOGGER.straggler(_min_over_ranks) if show_straggler else None
    if not dist.is_initialized() or dist.get_rank() == 0:
        if logged:
            print(COMMS_LOGGER.format_summary(logged), flush=True)
        if stragglers:
            print(COMMS_LOGGER.format_straggler(stragglers), flush=True)
        print(format_summary(tables), flush=True)
    if not return_dict:
        return None
    return {"summary": logged, "straggler_analysis": stragglers,
            "metadata": COMMS_LOGGER.metadata(), "booked": tables}


def _min_over_ranks(values: list) -> list:
    """Element-wise minimum of ``values`` over every rank (a MIN all-reduce, not logged)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    from dslaunch.accelerator import get_accelerator

    t = torch.tensor(values, dtype=torch.float64,
                     device=get_accelerator().current_device_name())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.tolist()


def reset_log() -> None:
    """Forget what the comms logger recorded (the booked byte counts stay: ``reset_stats``)."""
    COMMS_LOGGER.reset_data()


def has_comm_data() -> bool:
    return COMMS_LOGGER.has_data()


def get_comm_operation_count() -> int:
    return COMMS_LOGGER.get_total_operations()


def get_logged_comm_ops() -> list:
    return COMMS_LOGGER.get_operation_names()


def format_summary(tables: dict) -> str:
    head = (f"  {'group':<12} {'collective':<20} {'calls':>8} {'bytes':>16} {'sent_bytes':>16} "
            f"{'seconds':>10}")
    lines = ["[dslaunch] collectives booked on this rank", head]
    for label, stats in tables.items():
        for name, rec in sorted(stats.items()):
            lines.append(f"  {label:<12} {name:<20} {rec['calls']:>8,} {rec['bytes']:>16,} "
                         f"{rec['sent_bytes']:>16,} {rec['seconds']:>10.4f}")
    return "\n".join(lines)
