"""An engine's process grid (``topology.ProcessGrid``) under in-process recovery
(``engine/recovery/``), for any of its axes: AutoTP's ``data x model`` grid
(``tp.py``) and a pipeline's ``pipe x data`` grid (``pipe.py``).

The grid object itself stays (the engine, its ``mpu``, ``parallel_groups``' layout, a
``PipelineModule`` and activation checkpointing hold it): ``rebuild_grid`` makes its groups again
in place, with the same membership, on the new default group (``ProcessGrid.make_groups``), then
re-points what holds an old handle of its own: the modules' attributes (split layers), objects a
module keeps with a ``group`` (the vocabulary-parallel head's loss), the gradient-sum hooks of
``partition_config`` weights (``autotp_specs.sum_grads_over``), and the ``Comm`` objects of the
engine, its ZeRO strategy and the grid.

A replacement rank builds its engine alone, in a one-rank world (no collective the survivors
would have to mirror), on a *planned* grid (``planned_grid``): the coordinates of its rank in
the world it joins, every group a ``tensor_parallel.PlannedGroup`` (size and rank only: enough to
cut its TP slices or pick its pipeline stage) except the data group (and the sequence x data
plane), which is the one-rank world its ZeRO strategy is built on. Once joined, the same
``rebuild_grid`` makes the real groups in the survivors' order and replaces the stand-ins.

Its state comes from a survivor holding the same part of the model (``slice_of``: its TP rank,
its pipeline stage): a data-parallel replica. Hence a grid job recovers only at DP >= 2 and in a
world that keeps its size (``world_change_refused``: a smaller world needs another grid).
"""

from __future__ import annotations

import torch.distributed as dist

from dslaunch.engine.comm.collectives import group_label
from dslaunch.engine.parallel.topology import ProcessGrid
from dslaunch.engine.recovery.pipe import pipe_grid
from dslaunch.engine.recovery.tp import tp_grid


def engine_grid(engine) -> ProcessGrid | None:
    """The grid in-process recovery rebuilds for ``engine`` (a pipeline's, AutoTP's); None for
    an engine without one (plain data parallel)."""
    return pipe_grid(engine) or tp_grid(engine)


def _label(grid: ProcessGrid) -> tuple:
    """(the job's kind, its grid in words, what each rank holds of the model)."""
    if grid.num_stages > 1:
        return "a pipeline", f"PP {grid.num_stages} x DP {grid.dp_world_size}", "stages"
    return "an AutoTP", f"TP {grid.tp_world_size} x DP {grid.dp_world_size}", "slices"


def world_change_refused(engine, word: dict) -> str | None:
    """A grid job goes on only at its own world size (a replacement on the same host or a
    spare): a smaller world would need another grid, and another cut of the model."""
    grid = engine_grid(engine)
    if grid is None or int(word["world_size"]) == grid.topology.world_size():
        return None
    kind, layout, parts = _label(grid)
    return (f"the world of {kind} job cannot change size in process "
            f"({grid.topology.world_size()} -> {word['world_size']} ranks: the {layout} grid "
            f"and its {parts} would change)")


def slice_of(engine) -> str | None:
    """The part of the model this rank holds, in words ("stage 1", "TP rank 0"): the ranks
    that hold the same are its data-parallel replicas. None: every rank holds all of it."""
    grid = engine_grid(engine)
    if grid is None:
        return None
    parts = [f"stage {grid.stage_id}"] if grid.num_stages > 1 else []
    parts += [f"TP rank {grid.tp_rank}"] if grid.tp_world_size > 1 else []
    return ", ".join(parts) or None


def _handles(grid: ProcessGrid) -> list:
    # (data last: a replacement's data group and sequence x data plane are one object, its
    # one-rank world; the data group's new handle must win)
    return [grid.groups["pipe"], grid.groups["model"], grid.sequence_group,
            grid.sequence_data_group, grid.groups["data"]]


def rebuild_grid(engine) -> None:
    """After the new default group is up (every member calls this, at the same point): the
    grid's groups made again on it, and every holder of the old ones re-pointed."""
    grid = engine_grid(engine)
    old = _handles(grid)
    comms = (grid._dp_comm, grid._sdp_comm)  # (make_groups forgets them; their holders do not)
    grid.make_groups(dist.new_group)
    grid._dp_comm, grid._sdp_comm = comms
    grid.planned = False
    new = {id(o): n for o, n in zip(old, _handles(grid)) if o is not None}
    repoint(engine.module, new)
    _repoint_comms((engine.comm, engine.strategy.comm) + comms, new)


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


def _repoint_comms(comms, new: dict) -> None:
    """Each ``Comm`` (each once) on its group's new handle; ``rejoin.take_world``
    then reads its rank and size (``Comm.rebind``)."""
    for comm in {id(c): c for c in comms if c is not None}.values():
        if id(comm.group) in new:
            comm.group = new[id(comm.group)]
            comm.label = group_label(comm.group)
