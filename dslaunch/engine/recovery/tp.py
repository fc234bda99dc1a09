"""AutoTP under in-process recovery (``engine/recovery/``): which AutoTP engines
recover in process. The ``data x model`` grid of an AutoTP engine (``autotp.py``,
``topology.ProcessGrid``) is rebuilt on the new world by ``grid.py`` (as a pipeline's
is), which re-points every holder of its old groups: the split layers (``ColumnParallelLinear``,
``RowParallelLinear``, ``VocabParallelEmbedding``), any object a module keeps with a ``group``
(the vocabulary-parallel head's loss), the gradient-sum hooks of ``partition_config`` weights
(``autotp_specs.sum_grads_over``), and the engine's data-parallel ``Comm``, which the ZeRO
strategy shares.

A replacement rank builds its engine alone on a planned grid (``topology.planned_grid``,
through ``topology.build_grid``): its model group is a ``tensor_parallel.PlannedGroup`` (size and
rank only: enough to cut its own TP slices), its data group the one-rank world (its ZeRO
strategy is built at one data rank, as a plain replacement's is). It joins, makes the real
groups in the same order as the survivors, and the stand-ins are replaced.

Its state comes from a survivor of the same TP rank (``grid.slice_of``): a
data-parallel replica holds the same slices (and at ZeRO 0 the same optimizer state; at ZeRO 1-3
the shards come from its data group's shard copies). Hence refused: TP x DP 1 (no live peer
holds a lost rank's slices), a world that changes size (``grid.world_change_refused``:
the grid would change), pipeline or sequence axes, and TP engines whose groups are not AutoTP's
grid (an mpu of the script's own).
"""

from __future__ import annotations

from dslaunch.engine.parallel.topology import ProcessGrid


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
        return ("tensor and sequence parallel groups of a script's own mpu are not rebuilt in "
                "process (only AutoTP's data x model grid and a pipeline's pipe x data grid are)")
    if grid.num_stages > 1 or grid.sp_world_size > 1:
        return "AutoTP with pipeline or sequence parallel groups is not rebuilt in process"
    if grid.dp_world_size < 2:
        return (f"at TP {grid.tp_world_size} x DP 1 no live peer holds a lost rank's TP slices "
                "(a data-parallel replica of its TP rank would: run with DP >= 2)")
    return None
