"""Pipeline engines under in-process recovery (``engine/recovery/``): a
``PipelineModule`` trained with ``engine.train_batch()`` on a ``pipe x data`` grid, at ZeRO 0 or
1, when every stage has a data-parallel replica (DP >= 2) and the world keeps its size.

**Where the fault surfaces.** Every collective of a train batch comes before its optimizer
update: the p2p receives and sends of activations and gradients (``pipe/p2p.py``), the
data-parallel gradient all-reduce (the strategy's ``after_backward``), the tied weights'
reduction, the batch loss's all-reduce and broadcast (``_aggregate``, made at the ``step``
instruction before the update), and the whole model's gradient-norm all-reduce
(``pipe/grad_norm.py``) with which the update starts. So a rank lost after its update of step S
(``--inject kill:...,step=S``) leaves every survivor done with step S, and they meet the fault
in batch S+1, before any update. ``train_batch`` catches it (``guard.train_batch``), recovers,
and runs the same batch again in the new group: the abandoned batch is dropped (its gradients,
activations and p2p channels; no update, no step counted) and the call returns the loss of the
batch it trained, as a fault-free call would, so the script's loop of ``train_batch()`` calls
goes on unchanged. ZeRO 1 all-gathers after its update: a fault there is refused (``updating``),
as for the data-parallel engine.

**The data position.** The survivors had pulled some micro-batches of the abandoned batch from
``data_iter``: the engine kept them (``Replay``) and gives them again before pulling the rest,
so the batch trains on the same data. A replacement starts at the step the survivors completed:
the engine's own loader (``training_data=`` at ``initialize``, ``train_batch()`` without
``data_iter``) is moved on by the micro-batches the survivors' have served (``position_loader``:
``global_steps`` x gradient accumulation, read and thrown away); an iterator the script gives
must start at ``engine.global_steps`` as after a checkpoint load (e.g. a step-indexed one), which
the engine cannot check.

**The grid.** ``grid.rebuild_grid`` makes the pipe, data and model groups again in
place; ``rebuild`` here then makes the tied weights' groups again and opens fresh p2p channels
(the old ones' layouts and posted receives belong to the old group). A replacement builds alone
on a planned grid (``topology.get_grid``: stand-in pipe groups, the one-rank world as data
group), skips the tied weights' first sync, joins, and takes its stage's weights, optimizer state
(ZeRO 1: its shard from its data group's shard copies), scheduler and counters from a survivor of
its own stage.

Refused, with the reason printed: PP x DP 1 (no live peer holds a lost rank's stage), a world
that changes size (``grid.world_change_refused``), tensor or sequence parallel axes in
the pipeline (not rebuilt), and a fault inside ``eval_batch`` is not recovered (the rank fails
and the job restarts). A replacement's script sees a world of 1 until it joins: a topology sized
with ``dist.get_world_size()`` before ``initialize`` fails there (``num_stages=`` does not). A
hung rank is found by the hang watchdog from its data-parallel partner's wait (its stage
neighbours wait in p2p receives, which name no one), killed and replaced the same way.
"""

from __future__ import annotations

import torch.distributed as dist

from dslaunch.engine.core.pipe_engine import PipelineEngine
from dslaunch.engine.parallel.pipe.p2p import P2P
from dslaunch.engine.parallel.topology import ProcessGrid


def pipe_grid(engine) -> ProcessGrid | None:
    """The grid of a pipeline engine; None for another engine."""
    return engine.grid if isinstance(engine, PipelineEngine) else None


def refused(engine) -> str | None:
    """Why this pipeline engine cannot recover in process (None: it can)."""
    grid = engine.grid
    if grid.tp_world_size > 1 or grid.sp_world_size > 1:
        return ("a pipeline with tensor or sequence parallel axes is not rebuilt in process "
                "(PP x DP is)")
    if grid.dp_world_size < 2:
        return (f"at PP {grid.num_stages} x DP 1 no live peer holds a lost rank's pipeline "
                "stage (a data-parallel replica of its stage would: run with DP >= 2)")
    return None


def rebuild(engine) -> None:
    """After the grid's groups (every member, at the same point): the tied weights' groups made
    again, and new p2p channels (the counters kept)."""
    engine.module.tied_groups = engine.module.make_tied_groups(dist.new_group)
    stats, engine.p2p = engine.p2p.stats, P2P(engine.device)
    engine.p2p.stats = stats


class Replay:
    """The micro-batches of one ``train_batch`` call as it pulls them from ``data_iter``, kept so
    that a batch abandoned by a recovery runs again on the same ones (``rewind``)."""

    def __init__(self, data_iter):
        self.data_iter, self.taken, self.pos = data_iter, [], 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos == len(self.taken):
            self.taken.append(next(self.data_iter))
        self.pos += 1
        return self.taken[self.pos - 1]

    def rewind(self) -> None:
        self.pos = 0


def position_loader(engine) -> None:
    """A replacement's own loader at the step it joins (the first and last stages load data):
    the micro-batches the survivors' loaders have served, skipped."""
    loader = engine.training_dataloader
    if loader is None or not (engine.is_first_stage() or engine.is_last_stage()):
        return
    engine.set_dataloader(loader)
    for _ in range(engine.global_steps * engine.micro_batches):
        next(engine.data_iterator)
