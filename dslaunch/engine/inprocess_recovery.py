"""In-process recovery, the rank's side (``dslaunch run --recover in-process``).

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
   pipeline's ``train_batch`` runs the batch again itself: ``pipe_recovery.py``).

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

Engines on a process grid, with DP >= 2 and a world that keeps its size (``grid_recovery.py``:
``_take_world`` makes the grid's groups again on the new world and re-points every holder of the
old ones; a replacement builds alone on a planned grid of stand-in groups, which the same rebuild
replaces; its state comes from a survivor holding the same part of the model, ``_state_sources``:
a data-parallel replica, at ZeRO 1-3 its shard from the copies within its data group,
``recover_shards`` gathering over the strategy's group):

- AutoTP engines (``tensor_parallel.autotp_size``, ``tp_recovery.py``) at ZeRO 0-3; an abandoned
  step's forwards make no TP collective either (``_dry_forward``);
- pipeline engines (``PipelineModule`` + ``train_batch``, ``pipe_recovery.py``) at ZeRO 0-1: the
  fault surfaces inside ``train_batch`` before any rank's update, which runs the batch again on
  the micro-batches it had pulled; a replacement's own loader is moved on to the step.

Other layouts refuse (parameters offloaded to NVMe keep no copies; ZeRO++'s hpZ, MiCS and
quantized groups, sequence and expert parallel groups, tensor or sequence axes in a pipeline and
tensor-parallel groups of a script's own mpu are not rebuilt; AutoTP or a pipeline at DP 1 has
no live copy of a lost rank's slices or stage, and neither changes its world size): the rank
exits ``REFUSED_EXIT`` and the job restarts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from dslaunch import standby_priority
from dslaunch.recover_files import FILE_ENV, JOIN_ENV, REFUSED_EXIT, STANDBY_ENV, ack_path, read_json, write_json

WAIT_ENV = "DSLAUNCH_RECOVER_WAIT"
WAIT_DEFAULT = 30.0  # how long a rank whose collective failed waits for the launcher's word
POLL = 0.05


def _host_addresses(hosts: list) -> set:
    out = set()
    for host in hosts:
        try:
            out.update(info[4][0] for info in socket.getaddrinfo(host, None))
        except OSError:
            continue
    return out


def abort_connections(hosts: list, store_port: int) -> int:
    """Shut down this process's TCP connections to the job's ``hosts`` (loopback too), except the
    store's (``store_port``, either end): a gloo collective waiting on them raises. Returns how
    many were shut. Listening sockets are left alone (gloo aborts the process if its listener
    fails)."""
    peers = _host_addresses(hosts)
    shut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM:
                    continue
                peer, local = sock.getpeername(), sock.getsockname()
            except OSError:  # not connected (a listener)
                continue
            if store_port in (peer[1], local[1]):
                continue
            if peer[0] in peers or peer[0].startswith("127.") or peer[0] == "::1":
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
                except OSError:
                    pass
    return shut


class Watch:
    """The survivor's side: a thread that waits for the launcher's instruction and aborts."""

    def __init__(self, path: str, epoch: int = 0):
        self.path = path
        self.epoch = epoch  # instructions up to this one are done (a replacement starts at its own)
        self.word: dict | None = None
        self.arrived = threading.Event()
        self.abandoning = 0  # step() calls of the interrupted step still to skip
        self.script_skip = False  # the script's own collectives, until its next step's forward
        self.in_engine = 0  # inside an engine call: its collectives are not the script's
        self.joined = False  # a replacement that took its state from its peers
        self.aborted_at: float | None = None
        threading.Thread(target=self._run, daemon=True, name="dslaunch-recover").start()

    @classmethod
    def from_env(cls) -> "Watch | None":
        path = os.environ.get(FILE_ENV)
        if not path:
            return None
        word = join_word()
        return cls(path, word["epoch"] if word else 0)

    def _run(self) -> None:
        seen = None  # the file's (inode, mtime, size) last read: an unchanged file is not parsed
        # again (the agent writes each word whole under a new inode: recover_files.write_json)
        while True:
            time.sleep(POLL)
            if self.arrived.is_set():
                continue
            try:
                st = os.stat(self.path)
            except OSError:
                continue
            if (st.st_ino, st.st_mtime_ns, st.st_size) == seen:
                continue
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            word = read_json(self.path)
            if word is None or word.get("epoch", 0) <= self.epoch:
                continue
            self.word = word
            self.aborted_at = time.time()
            abort_connections(word.get("hosts", []), int(os.environ.get("MASTER_PORT", 0)))
            self.arrived.set()

    def wait_for_word(self) -> bool:
        return self.arrived.wait(float(os.environ.get(WAIT_ENV, WAIT_DEFAULT)))

    def ack(self, **fields) -> None:
        write_json(ack_path(self.path), {"epoch": self.word["epoch"], **fields})

    def done(self) -> None:
        self.epoch = self.word["epoch"]
        self.word = None
        self.arrived.clear()


# what a collective raises when a peer is gone or its connections were shut (gloo, NCCL)
_FAULT_WORDS = ("connection closed", "connection reset", "broken pipe", "timed out", "gloo",
                "nccl", "socket", "peer")


def comm_fault(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _FAULT_WORDS)


def guarded(engine, name: str, fn, *args, **kwargs):
    """Run the engine's ``backward``/``step`` so that a collective failing because of a lost
    peer turns into a recovery (``recover``) instead of an exception; the interrupted step's
    remaining calls are then skipped (``backward`` returns its loss, ``step`` nothing) until the
    script's loop has made the ``step()`` calls left of that step (one per micro-batch), so
    that it starts the step again at its first micro-batch, as a replacement does."""
    watch = engine._recovery
    if watch.abandoning:
        if name == "step":
            watch.abandoning -= 1
            return None
        return args[0] if args else None
    gas = engine._gas
    micro = engine.micro_steps % gas  # (before the recovery resets the count)
    with engine_call(engine):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            if not comm_fault(exc) or not watch.wait_for_word():
                raise
            recover(engine, watch)
    # the step() calls the script still makes for the abandoned step: this micro-batch's (unless
    # the fault came inside it) and the later ones'
    watch.abandoning = gas - micro - (1 if name == "step" else 0) \
        if engine._managed_accumulation else (0 if name == "step" else 1)
    watch.script_skip = True
    return None if name == "step" else (args[0] if args else None)


def guarded_forward(engine, fn):
    """Run the module's forward (``fn``) as ``guarded`` runs ``backward``/``step``: at ZeRO 3 it
    gathers parameters, so a lost peer can fail it. After the recovery, and in every forward of
    the abandoned step (its remaining ``backward``/``step`` calls are skipped), the forward runs
    dry (``strategy.dry_forward``: no collective, zero weights at stage 3): its output only
    carries the script to the end of that step."""
    watch = engine._recovery
    if watch.abandoning:
        with _dry_forward(engine):
            return fn()
    micro = engine.micro_steps % engine._gas  # (before the recovery resets the count)
    with engine_call(engine):
        try:
            return fn()
        except RuntimeError as exc:
            if not comm_fault(exc) or not watch.wait_for_word():
                raise
            recover(engine, watch)
    # this micro-batch's step() call and the later ones'; its backward is skipped with them
    watch.abandoning = engine._gas - micro if engine._managed_accumulation else 1
    watch.script_skip = True
    with _dry_forward(engine):
        return fn()


def _dry_forward(engine):
    """The context of a forward that makes no collective: the strategy's (ZeRO 3 gathers) and,
    under AutoTP, the split layers' (``tensor_parallel.dry_collectives``)."""
    import contextlib

    from .tensor_parallel import dry_collectives
    from .tp_recovery import tp_grid

    stack = contextlib.ExitStack()
    stack.enter_context(engine.strategy.dry_forward())
    if tp_grid(engine) is not None:
        stack.enter_context(dry_collectives())
    return stack


class engine_call:
    """``with engine_call(engine):`` the collectives inside are the engine's own (a checkpoint's
    save or load), not the script's: the engine call itself decides what a lost peer there
    means."""

    def __init__(self, engine):
        self.watch = engine._recovery

    def __enter__(self):
        if self.watch is not None:
            self.watch.in_engine += 1

    def __exit__(self, *exc):
        if self.watch is not None:
            self.watch.in_engine -= 1


class _Skipped:
    """What a skipped or recovered ``async_op=True`` call of the script returns."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class ScriptCollectives:
    """The collectives the script makes itself (``torch.distributed`` calls outside any engine
    call, seen by the bootstrap's wrappers: ``dslaunch/torch_progress.py``), such as the loss
    all-reduce most training loops log with. One that fails on a lost peer starts the same
    recovery as the engine's own, and returns with its outputs as they were (a value logged for
    that step is then this rank's own). After a recovery the script's collectives are skipped
    until its next step's ``forward``, on every member: the survivors finish the abandoned
    iteration of their loop while a replacement starts at the top of it, and neither makes the
    collectives the other would not (a replacement's before its first forward, such as a stop
    check, are skipped too)."""

    def __init__(self, engine):
        self.engine = engine

    def applies(self) -> bool:
        watch = self.engine._recovery
        return watch is not None and watch.in_engine == 0

    def call(self, fn, op: str, args, kwargs):
        watch = self.engine._recovery
        if watch.script_skip:
            return _Skipped() if kwargs.get("async_op") else None
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            with engine_call(self.engine):  # the recovery's own collectives
                if not recover_between_steps(self.engine, exc):
                    raise
            return _Skipped() if kwargs.get("async_op") else None


def recover_between_steps(engine, exc: BaseException) -> bool:
    """A call between the script's steps (its own collective, a checkpoint save) failed with
    ``exc``: when a lost peer is the cause, recover (the last completed step stands) and skip the
    script's collectives until its next step's forward. False: not a recoverable fault."""
    watch = engine._recovery
    if watch is None or not comm_fault(exc) or not watch.wait_for_word():
        return False
    recover(engine, watch)
    watch.script_skip = True
    return True


def abandonable_save(engine, save):
    """``save()``, a checkpoint save, as the engine's own call: a peer lost during it is
    recovered, the save abandoned (False: ``latest`` moves only once every rank wrote) and
    training goes on."""
    with engine_call(engine):
        try:
            return save()
        except RuntimeError as exc:
            if not recover_between_steps(engine, exc):
                raise
            return False


def holds_live_state(engine) -> bool:
    """True (once) for a replacement that took the live state from its peers: the script's load
    at start must neither replace it nor make collectives they do not (a later load is the
    whole job's again)."""
    watch = engine._recovery
    if watch is None or not watch.joined:
        return False
    watch.joined = False
    return True


def watch_script_collectives(engine) -> None:
    """Recover from faults in the script's own collectives too (the bootstrap's wrappers must be
    installed: they are whenever the agent keeps a progress record)."""
    if engine._recovery is None:
        return
    from dslaunch import torch_progress

    torch_progress.SCRIPT_HOOKS = ScriptCollectives(engine)


def unsupported(engine) -> str | None:
    """Why this engine cannot recover in process (None: it can)."""
    why = _layout_refused(engine)
    if why is None and engine.zero_stage in (1, 2, 3) and not _sharded(engine):
        what = "parameter and optimizer" if engine.zero_stage == 3 else "optimizer"
        why = (f"ZeRO stage {engine.zero_stage} here keeps no copy of each rank's {what} "
               f"shard ({shard_copies_refused(engine)})")
    return why


def _layout_refused(engine) -> str | None:
    from .pipe_recovery import pipe_grid

    if pipe_grid(engine) is not None:  # a pipeline: PP x DP with DP >= 2
        from .pipe_recovery import refused

        why = refused(engine)
        if why:
            return why
    elif type(engine).__name__ != "DSLaunchEngine" or engine._dp_rank is not None:
        return "tensor and sequence parallel groups are not rebuilt in process"
    elif getattr(engine, "mpu", None) is not None:  # tensor parallel: only AutoTP's grid
        from .tp_recovery import refused

        why = refused(engine)
        if why:
            return why
    if engine.has_moe_layers:
        return "expert parallel groups are not rebuilt in process"
    if not engine._trains:
        return "a forward-only engine has no step to roll back to"
    return None


def shard_copies_refused(engine) -> str | None:
    """Why a ZeRO 1-3 engine keeps no copies of its shards (None: it can keep them)."""
    strategy = engine.strategy
    if _device(strategy.zero.offload_optimizer) == "nvme":
        return ("offload_optimizer keeps the optimizer states on NVMe, in files the copies do "
                "not read")
    if getattr(strategy, "experts", None):
        return "expert parallel groups are not rebuilt in process"
    return _stage3_refused(strategy.zero) if strategy.stage == 3 else None


def _device(offload) -> str:
    """An offload section's device: "none", "cpu" or "nvme"."""
    return getattr(offload.device, "value", offload.device)


def _stage3_refused(zero) -> str | None:
    if _device(zero.offload_param) == "nvme":
        # (offload_param to the CPU: the copies read and refill its host store)
        return "offload_param keeps the parameter shard on NVMe, in files the copies do not read"
    if zero.zero_hpz_partition_size > 1 or zero.mics_shard_size > 0:
        return "ZeRO++'s hpZ and MiCS groups are not rebuilt in process"
    if zero.zero_quantized_weights or zero.zero_quantized_gradients:
        return "ZeRO++'s quantized collectives are not rebuilt in process"
    return None


def keep_shard_copies(engine) -> None:
    """ZeRO 1-3 under in-process recovery: each rank keeps a copy of a neighbour's shard
    (zero/shard_copies.py), taken now and after every optimizer update."""
    if engine.zero_stage not in (1, 2, 3) or _layout_refused(engine) \
            or shard_copies_refused(engine):
        return
    from .zero.shard_copies import ShardCopies

    engine.strategy.copies = ShardCopies()
    engine.strategy.copies.exchange(engine.strategy)


def _sharded(engine) -> bool:
    return getattr(engine.strategy, "copies", None) is not None


def _join_group(word: dict) -> None:
    """Leave the old process group (if any) and join the instruction's."""
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    os.environ.update(MASTER_ADDR=str(word["master_addr"]), MASTER_PORT=str(word["master_port"]),
                      RANK=str(word["rank"]), WORLD_SIZE=str(word["world_size"]))
    dist.init_process_group(backend, rank=int(word["rank"]), world_size=int(word["world_size"]))
    from dslaunch import progress_record

    record = progress_record.writer()
    if record is not None:  # every member numbers the new group's collectives from 1
        record.new_groups()


def _module_state(engine) -> dict:
    """The module's state for a newcomer: all of it, or with shard copies what the optimizer
    does not train (buffers, frozen parameters): the trained parameters come from the shards
    (at ZeRO 3 no rank holds them whole)."""
    sd = engine.module.state_dict(keep_vars=True)
    if _sharded(engine):
        trained = {id(p) for g in engine.strategy.groups for p in g.params.values()}
        sd = {k: v for k, v in sd.items() if id(v) not in trained}
    return {k: v.detach() for k, v in sd.items()}


def engine_state(engine) -> dict:
    sched = engine.lr_scheduler
    # a ZeRO 1-3 shard is the sender's own: each rank's comes from the shards (recover_shards)
    strategy = None if _sharded(engine) else engine.strategy.state_dict()
    return {"module": _module_state(engine), "strategy": strategy,
            # every TP rank's rows (AutoTP): a replacement built alone could not gather them
            "autotp_layout": getattr(engine.module, "ds_autotp_layout", None),
            "lr_scheduler": sched.state_dict() if sched is not None else None,
            "loss_scaler": engine.precision.scaler.state_dict(),
            "counters": {k: getattr(engine, k) for k in ("global_steps", "global_samples",
                                                         "micro_steps", "skipped_steps")}}


def load_engine_state(engine, state: dict) -> None:
    engine.module.load_state_dict(state["module"], strict=not _sharded(engine))
    if state["strategy"] is not None:
        engine.strategy.load_state_dict(state["strategy"])
    if state["lr_scheduler"] is not None and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    engine.precision.scaler.load_state_dict(state["loss_scaler"])
    if state.get("autotp_layout") is not None:
        engine.module.ds_autotp_layout = state["autotp_layout"]
    for key, value in state["counters"].items():
        setattr(engine, key, value)


def _take_world(engine) -> None:
    """The engine's view of the (new) group: rank, size, the strategy's hooks; an AutoTP or
    pipeline engine's grid made again on it first (``grid_recovery.py``; a pipeline's tied
    weights' groups and p2p channels too, ``pipe_recovery.py``)."""
    from .grid_recovery import engine_grid, rebuild_grid
    from .pipe_recovery import pipe_grid, rebuild

    comm = engine.comm
    before = comm.world_size
    grid = engine_grid(engine)
    if grid is not None:  # (its world keeps its size: grid_recovery.world_change_refused)
        rebuild_grid(engine)
        if pipe_grid(engine) is not None:
            rebuild(engine)
    comm.rebind()
    if comm.world_size != before and grid is None:
        _resize_batch(engine)
    # comm is the grid's data group, the world otherwise
    engine.global_rank, engine.world_size = dist_rank_and_size() if grid is not None else \
        (comm.rank, comm.world_size)
    engine.dp_world_size = comm.world_size
    engine.strategy.rebind_world()
    if engine.training_dataloader is not None:  # the sampler's share of the data for this rank
        sampler = engine.training_dataloader.sampler
        if hasattr(sampler, "num_replicas"):
            sampler.rank, sampler.num_replicas = comm.rank, comm.world_size


def dist_rank_and_size() -> tuple:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def _resize_batch(engine) -> None:
    """The world changed size (a lost host): the batch triad as the config resolves for it, the
    rule a restart on that many ranks follows (a written train_batch_size is kept by changing the
    accumulation steps where it divides; else the global batch follows the world). Raises
    ConfigError when the config cannot run at that size."""
    from .api import resolve_engine_config

    source, origin = getattr(engine, "_config_source", (None, None))
    if source is None:
        raise RuntimeError("the engine's config source is unknown")
    cfg = resolve_engine_config(source, engine.module, origin=origin)
    engine._micro_batch = cfg.train_micro_batch_size_per_gpu
    engine._gas = cfg.gradient_accumulation_steps
    engine._train_batch = cfg.train_batch_size
    engine.tput_timer.batch_size = engine._train_batch
    engine.micro_steps = engine.global_steps * engine._gas


def _rendezvous(engine, joining: bool) -> tuple:
    """Every member's completed step; then the first survivor's state to the newcomers. Returns
    (why the members cannot go on from one state or None, the members, the state or None)."""
    import torch.distributed as dist

    from .grid_recovery import slice_of

    step = -1 if joining else engine.global_steps
    # a ZeRO 1-2 update between its local step and the end of its all-gather is neither before
    # nor after that step on this rank
    updating = not joining and bool(getattr(engine.strategy, "updating", False))
    members = [None] * dist.get_world_size()
    dist.all_gather_object(members, {"step": step, "joining": joining, "updating": updating,
                                     "slice": slice_of(engine)})
    steps = sorted({m["step"] for m in members if not m["joining"]})
    if len(steps) != 1:
        return f"the survivors disagree on the last completed step ({steps})", members, None
    if any(m["updating"] for m in members):
        return ("the fault came inside an optimizer update (between a rank's local step and the "
                "end of its all-gather)"), members, None
    sources, why = _state_sources(members)
    if why:
        return why, members, None
    state = None
    for held, src in sources.items():  # one broadcast per slice the newcomers need
        box = [engine_state(engine) if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src=src)
        if joining and held == slice_of(engine):
            state = box[0]
    return None, members, state


def _state_sources(members: list) -> tuple:
    """({slice a newcomer needs: the survivor that sends it}, why not or None). A slice is the
    part of the model a member holds (``grid_recovery.slice_of``: its TP rank, its pipeline
    stage), else None (every member holds the same); the first survivor holding it sends it
    (rank 0 itself may be the one replaced)."""
    sources = {}
    for m in members:
        if not m["joining"] or m["slice"] in sources:
            continue
        src = next((r for r, s in enumerate(members)
                    if not s["joining"] and s["slice"] == m["slice"]), None)
        if src is None:
            return {}, (f"no live peer holds {m['slice']} of the model (every data-parallel "
                        "replica of it was lost)")
        sources[m["slice"]] = src
    return sources, None


def _relayout(strategy, joining: bool) -> bool:
    """Whether a member lays its parameters out again: a replacement, every member when the world
    shrank, and at ZeRO 3 every member (its store's gathered units and gathers in flight belong to
    the old group, and the layout looks the hosts up again: a collective)."""
    comm = strategy.comm
    return joining or strategy.stage == 3 or (strategy.world, strategy.rank) != \
        (comm.world_size, comm.rank)


def recover_shards(engine, joining: bool) -> str | None:
    """ZeRO 1-3: every member hands in the shards it holds (its own and its copy of its ward's,
    zero/shard_copies.py); a member whose layout changed (``_relayout``) lays its parameters out
    again and takes its new shard from them; then the
    updated chunks are all-gathered and the copies exchanged in the new world. Returns why the
    shards cannot rebuild the state (None: done). Each member decides from the same gathered
    shards, so all refuse or none."""
    import torch.distributed as dist

    from .checkpoint.zero_shards import HeldShards, load_resharded_from
    from .zero.shard_copies import consistent

    strategy = engine.strategy
    held = {} if joining else strategy.copies.held(strategy)
    # the optimizer's hyperparameters as they are now: a copy's were taken inside the step,
    # before the LR scheduler stepped
    hyper = None if joining else [{k: v for k, v in pg.items() if k != "params"}
                                  for pg in strategy.optimizer.param_groups]
    # over the strategy's group: under AutoTP each TP rank's data group holds shards of its own
    # slices, under the same names as the other TP ranks'
    offers = [None] * strategy.comm.world_size
    dist.all_gather_object(offers, (held, hyper), group=strategy.comm.group)
    shards = {rank: sd for offer, _ in offers for rank, sd in offer.items()}
    live = next(h for _, h in offers if h is not None)
    for sd in shards.values():
        sd["param_groups"] = live
    old_world = max((sd["zero"]["world_size"] for sd in shards.values()), default=0)
    why = consistent(shards, old_world)
    if why:
        return why
    if _relayout(strategy, joining):
        strategy.repartition()
        load_resharded_from(strategy, HeldShards(shards), old_world, gather=False)
        strategy.version = next(iter(shards.values()))["version"]
    strategy._all_gather_params()
    strategy.copies.exchange(strategy)
    return None


def _refuse(watch_or_path, why: str) -> None:
    import sys

    sys.stderr.write(f"dslaunch: in-process recovery refused: {why}; the launcher restarts "
                     "every rank instead\n")
    sys.stderr.flush()
    if isinstance(watch_or_path, Watch):
        watch_or_path.ack(status="refused", why=why)
    else:
        write_json(ack_path(watch_or_path), {"epoch": 0, "status": "refused", "why": why})
    os._exit(REFUSED_EXIT)


def recover(engine, watch: Watch) -> None:
    """A survivor's recovery (the module docstring's steps 2-5); the rank exits ``REFUSED_EXIT``
    when it cannot."""
    from .grid_recovery import world_change_refused

    word = watch.word
    why = unsupported(engine) or world_change_refused(engine, word)
    if why:
        _refuse(watch, why)
    # this rank's main thread took the word (the launcher gives up at once on a survivor that does
    # not within the hang timeout: stuck outside any collective, it would never answer)
    watch.ack(status="recovering")
    t_abort = time.time()
    engine._abandon_step()  # before the state is sent (counters): the step starts again at micro 0
    _join_group(word)
    t_group = time.time()
    why, members, state = _rendezvous(engine, joining=False)
    if why:
        _refuse(watch, why)
    try:
        _take_world(engine)
    except Exception as exc:
        _refuse(watch, f"the job cannot go on at world size {word['world_size']}: {exc}")
    if _sharded(engine):
        why = recover_shards(engine, joining=False)
        if why:
            _refuse(watch, why)
    t_state = time.time()
    watch.ack(status="recovered", step=engine.global_steps, joined=sum(m["joining"] for m in members),
              seconds={"abort": round(t_abort - (watch.aborted_at or t_abort), 3),
                       "rebuild": round(t_group - t_abort, 3),
                       "state": round(t_state - t_group, 3)})
    watch.done()


def join(engine, word: dict) -> None:
    """A replacement: leave the one-rank world the engine was built in, join the group, load
    the state the first survivor sends."""
    path = os.environ.get(FILE_ENV, "")
    why = unsupported(engine)
    if why:
        _refuse(path, why)
    t0 = time.time()
    _join_group(word)
    t_group = time.time()
    why, _, state = _rendezvous(engine, joining=True)
    if why or state is None:
        _refuse(path, why or "no state came from the survivors")
    _take_world(engine)
    load_engine_state(engine, state)
    if _sharded(engine):
        why = recover_shards(engine, joining=True)
        if why:
            _refuse(path, why)
    engine.strategy.zero_grad()
    from .pipe_recovery import pipe_grid, position_loader

    if pipe_grid(engine) is not None:  # its own loader at the survivors' step
        position_loader(engine)
    if engine._recovery is not None:
        engine._recovery.joined = True
        # the survivors skip the script's collectives until their next forward; so does the
        # replacement, which starts at the top of the loop (a stop check or a broadcast made
        # there would otherwise meet a survivor's first forward)
        engine._recovery.script_skip = True
    if path:
        write_json(ack_path(path), {"epoch": word["epoch"], "status": "joined",
                                     "step": engine.global_steps,
                                     "seconds": {"rebuild": round(t_group - t0, 3),
                                                 "state": round(time.time() - t_group, 3)}})


# imported while a standby waits, not on the recovery's path: the engine's modules, and torch's
# compiler, which torch.optim's first Optimizer imports (about 4 s of the replacement's 4.6 s on
# this project's 2-core host)
def _prewarm() -> None:
    try:  # only a head start: the real imports report any error
        import torch._dynamo  # noqa: F401

        from dslaunch import config  # noqa: F401

        from . import engine  # noqa: F401
        from .pipe import engine as pipe_engine  # noqa: F401
        from .sequence import layout  # noqa: F401
    except Exception:
        pass


def await_promotion() -> None:
    """A standby process (the agent started it ahead of any fault) waits here, at dslaunch's first
    call, until it is promoted to a lost rank: then it takes that rank's environment and goes on
    as a replacement (``join``)."""
    path = os.environ.get(STANDBY_ENV)
    if not path:
        return
    _prewarm()
    while (word := read_json(path)) is None:
        time.sleep(0.01)
    os.environ.update(word["env"])
    del os.environ[STANDBY_ENV]
    standby_priority.restore()
    # a standby had no progress record, so the script's torch.distributed calls were not wrapped:
    # wrap them now (the hang watchdog, and recovery from a fault in a collective of the script's)
    from dslaunch import torch_progress

    torch_progress.install_on_import()
    import sys

    injected = sys.modules.get("dslaunch.engine.fault_injection")
    if injected is not None:  # --inject after=: a promoted standby's life starts now
        injected._T0 = time.monotonic()



def join_word() -> dict | None:
    text = os.environ.get(JOIN_ENV)
    return json.loads(text) if text else None


def job_world_size() -> int:
    """The job's world size; for a replacement rank, built alone before it joins, the world it
    joins."""
    import torch.distributed as dist

    word = join_word()
    return int(word["world_size"]) if word else dist.get_world_size()


def init_private_world() -> None:
    """A replacement builds its engine alone first: a one-rank group on an in-memory store."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
