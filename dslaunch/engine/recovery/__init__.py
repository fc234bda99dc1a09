"""In-process recovery, the rank's side (``dslaunch run --recover in-process``).

``initialize`` builds the recovery (``inprocess.py``: ``recovery_for_this_rank``; the engine's
do-nothing default when recovery is off is ``core/recovery_seams.py``) and hands it to the engine,
which calls it at its seams: forward, backward, step, train_batch, save and load. Nothing below
this package imports it. Its modules: ``watch.py`` (the launcher's word, the abort),
``guard.py`` (the seams: a lost peer turned into a recovery), ``rejoin.py`` (the new group, the
rendezvous, the survivor's and the replacement's recovery), ``state.py`` (the state sent and the
shards rebuilt), ``refusals.py`` (what cannot recover, and why), ``grid.py``, ``tp.py``,
``pipe.py`` (engines on a process grid), ``shard_copies.py`` (ZeRO 1-3's copies of a
neighbour's shard).

When a rank of the job dies (or hangs and the launcher kills it), the launcher does not stop the
others: it writes each survivor's agent an instruction (``recover`` in ``launcher/events.py``),
which the agent puts in the file this rank watches (``DSLAUNCH_RECOVER_FILE``), and it starts a
replacement process for the lost rank (``DSLAUNCH_RECOVER_JOIN`` holds the same instruction).

A survivor:

1. **abort**: a thread of this module sees the instruction and shuts down the rank's TCP
   connections to the job's hosts (not the store's), so a collective blocked on the lost peer
   raises at once (gloo has no abort of its own; a killed peer's reset does the same a moment
   earlier, and then the rank waits here for the instruction instead of failing);
2. **rebuild**: the engine call that raised (``backward``/``step``: ``engine.py``) destroys the old
   process group and joins a new one on a fresh store with the same ranks;
3. **agree**: every member says its completed step; survivors that disagree cannot roll back to
   one state (the fault came between their optimizer steps): the rank exits with
   ``REFUSED_EXIT`` and the launcher falls back to restarting every rank;
4. **state transfer**: the first survivor (under AutoTP the first of the newcomer's TP rank, in
   a pipeline of its stage) broadcasts the state a checkpoint would hold (module, optimizer with
   its fp32 masters, scheduler, loss scaler, counters); survivors already hold it;
5. **roll back**: the interrupted step is abandoned (its gradients dropped, no optimizer step, no
   step counted) and the script's loop goes on from the next ``forward`` at the same step (a
   pipeline's ``train_batch`` runs the batch again itself: ``pipe.py``).

A replacement builds its engine in a one-rank world of its own (so building makes no collective
the survivors would have to mirror), with the config resolved for the real world size, then joins
the new group as the survivors do and loads the state the first survivor sends.

Supported: the data-parallel engine at ZeRO stage 0 (every rank holds the whole model and
optimizer) and at stages 1-3, where each rank also keeps a copy of one other rank's shard
(``zero/shard_copies.py``: its optimizer shard, and at stage 3 its parameter shard too; with
``offload_optimizer`` the host-side masters and moments) and the state moves through
``recover_shards``. At stage 3 forward gathers parameters too, so a fault
can surface there (``guarded_forward``), and the forwards of an abandoned step run dry (no
collective: a replacement makes the new group's first ones).

Engines on a process grid, with DP >= 2 and a world that keeps its size (``grid.py``:
``_take_world`` makes the grid's groups again on the new world and re-points every holder of the
old ones; a replacement builds alone on a planned grid of stand-in groups, which the same rebuild
replaces; its state comes from a survivor holding the same part of the model, ``_state_sources``:
a data-parallel replica, at ZeRO 1-3 its shard from the copies within its data group,
``recover_shards`` gathering over the strategy's group):

- AutoTP engines (``tensor_parallel.autotp_size``, ``tp.py``) at ZeRO 0-3; an abandoned
  step's forwards make no TP collective either (``_dry_forward``);
- pipeline engines (``PipelineModule`` + ``train_batch``, ``pipe.py``) at ZeRO 0-1: the
  fault surfaces inside ``train_batch`` before any rank's update, which runs the batch again on
  the micro-batches it had pulled; a replacement's own loader is moved on to the step.

Other layouts refuse (parameters offloaded to NVMe keep no copies; ZeRO++'s hpZ, MiCS and
quantized groups, sequence and expert parallel groups, tensor or sequence axes in a pipeline and
tensor-parallel groups of a script's own mpu are not rebuilt; AutoTP or a pipeline at DP 1 has
no live copy of a lost rank's slices or stage, and neither changes its world size): the rank
exits ``REFUSED_EXIT`` and the job restarts.
"""
