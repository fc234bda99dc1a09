"""AutoTP under in-process recovery (``engine/inprocess_recovery.py``): the ``data x model`` grid
of an AutoTP engine (``autotp.py``, ``topology.ProcessGrid``) rebuilt on the new world, and every
holder of its groups pointed at the new ones.

The grid object itself stays (the engine's ``mpu``, ``parallel_groups``' layout and the
activation checkpointing hold it): ``ProcessGrid.make_groups`` replaces its groups in place, with
the same membership, on the new default group. What holds a group handle of its own is then
re-pointed by ``repoint`` from the old handle to the new one: the split layers
(``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding``), any object a
module keeps with a ``group`` (the vocabulary-parallel head's loss), the gradient-sum hooks of
``partition_config`` weights (``autotp_specs.sum_grads_over``), and the engine's data-parallel
``Comm``, which the ZeRO strategy shares.

A replacement rank builds its engine alone, in a one-rank world (no collective the survivors
would have to mirror): ``planned_grid`` gives it the grid of the world it will join, whose model
group is a ``tensor_parallel.PlannedGroup`` (size and rank only: enough to cut its own TP
slices) and whose data group is the one-rank world (its ZeRO strategy is built at one data rank,
as a plain replacement's is). It joins, makes the real groups in the same order as the
survivors, and the same ``repoint`` replaces the stand-ins.

Its state comes from a survivor of the same TP rank (``slice_of``): a data-parallel replica holds
the same slices (and at ZeRO 0 the same optimizer state; at ZeRO 1-3 the shards come from its
data group's shard copies). Hence refused: TP x DP 1 (no live peer holds a lost rank's slices),
a world that changes size (the grid would change), pipeline or sequence axes, and TP engines
whose groups are not AutoTP's grid (an mpu of the script's own).
"""

from __future__ import annotations

import torch.distributed as dist

from .tensor_parallel import PlannedGroup
from .topology import ProcessGrid, make_topology


def tp_grid(engine) -> ProcessGrid | None:
    """The AutoTP grid of ``engine``; None when it has none."""
    grid = getattr(engine, "mpu", None)
    if isinstance(grid, ProcessGrid) and getattr(engine.module, "ds_autotp_parsed", False):
        return grid
    return None


def refused(engine) -> str | None:
    """Why this tensor-parallel engine cannot recover in process (None: it can)."""
    grid = tp_grid(engine)
    if grid is None:
        return ("pipeline, tensor and sequence parallel groups are not rebuilt in process (only "
                "AutoTP's data x model grid is)")
    if grid.num_stages > 1 or grid.sp_world_size > 1:
        return "AutoTP with pipeline or sequence parallel groups is not rebuilt in process"
    if grid.dp_world_size < 2:
        return (f"at TP {grid.tp_world_size} x DP 1 no live peer holds a lost rank's TP slices "
                "(a data-parallel replica of its TP rank would: run with DP >= 2)")
    return None


def world_change_refused(engine, word: dict) -> str | None:
    """A tensor-parallel job goes on only at its own world size (a replacement on the same
    host): a smaller world would need another grid and another cut of every slice."""
    grid = tp_grid(engine)
    if grid is None or int(word["world_size"]) == grid.topology.world_size():
        return None
    return (f"the world of an AutoTP job cannot change size in process ({grid.topology.world_size()}"
            f" -> {word['world_size']} ranks: the TP x DP grid and its slices would change)")


def slice_of(engine) -> int | None:
    """This rank's TP rank (whose slices it holds); None for an engine without AutoTP."""
    grid = tp_grid(engine)
    return None if grid is None else grid.tp_rank


def planned_grid(tp: int, sequence: int, word: dict) -> ProcessGrid:
    """A replacement rank's grid while it is alone: the coordinates of its rank in the world it
    joins, the model group a ``PlannedGroup``, the other axes the one-rank world."""
    rank = int(word["rank"])
    grid = ProcessGrid.__new__(ProcessGrid)
    grid.topology = make_topology(int(word["world_size"]), model=tp, sequence=sequence)
    grid.global_rank, grid.coord = rank, grid.topology.get_coord(rank)
    grid.make_groups(lambda ranks: PlannedGroup(ranks, rank) if rank in ranks else None)
    alone = dist.group.WORLD  # what the engine's Comm and strategy reduce over until it joins
    for axis in ("pipe", "data"):
        grid.groups[axis] = alone
    grid.pipe_group = grid.data_group = grid.sequence_data_group = alone
    return grid


def rebuild_grid(engine) -> None:
    """After the new default group is up (every member calls this, at the same point): the
    grid's groups made again on it, and every holder of the old ones re-pointed."""
    grid = tp_grid(engine)
    old = {axis: grid.groups[axis] for axis in ("model", "data")}
    grid.make_groups(dist.new_group)
    # (data last: a replacement's stand-in for the pipe axis is its one-rank world too)
    new = {id(old[axis]): grid.groups[axis] for axis in ("model", "data")}
    repoint(engine.module, new)
    _repoint_comm(engine, grid.data_group)


def repoint(module, new: dict) -> None:
    """Every group handle ``module`` holds whose id is a key of ``new`` replaced by its value:
    attributes of its modules, ``group`` attributes of objects they keep, and the gradient-sum
    hooks of its parameters."""
    for m in module.modules():
        for name, value in list(vars(m).items()):
            if id(value) in new:
                setattr(m, name, new[id(value)])
            elif id(getattr(value, "group", None)) in new:
                value.group = new[id(value.group)]
    for p in module.parameters():
        hook = getattr(p, "ds_tp_grad_sum", None)
        if hook is not None and id(hook.group) in new:
            hook.group = new[id(hook.group)]


def _repoint_comm(engine, group) -> None:
    """The engine's data-parallel ``Comm`` (and the strategy's, the same object or not) on the
    new data group; ``inprocess_recovery._take_world`` reads its rank and size."""
    from .comm import group_label

    for comm in {id(c): c for c in (engine.comm, engine.strategy.comm)}.values():
        comm.group = group
        comm.label = group_label(group)
