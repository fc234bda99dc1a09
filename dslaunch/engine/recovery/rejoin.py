"""The new group after a fault: every member leaves the old process group and joins the
instruction's, says its completed step (``rendezvous``), takes the new world (the grid's groups
made again, the batch triad resized when the world shrank) and the state it lacks. ``recover`` is a
survivor's path, ``join`` a replacement's; either exits ``REFUSED_EXIT`` (``refuse``) when the
members cannot go on from one state, and the launcher restarts every rank."""

from __future__ import annotations

import os
import time

from dslaunch.engine.core.engine_config import resolve_engine_config
from dslaunch.engine.recovery import pipe
from dslaunch.engine.recovery.grid import engine_grid, rebuild_grid, slice_of, world_change_refused
from dslaunch.engine.recovery.refusals import sharded, unsupported
from dslaunch.engine.recovery.state import engine_state, load_engine_state, recover_shards
from dslaunch.engine.recovery.watch import Watch
from dslaunch.recover_files import FILE_ENV, REFUSED_EXIT, ack_path, write_json


def join_group(word: dict) -> None:
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


def take_world(engine) -> None:
    """The engine's view of the (new) group: rank, size, the strategy's hooks; an AutoTP or
    pipeline engine's grid made again on it first (``grid.py``; a pipeline's tied
    weights' groups and p2p channels too, ``pipe.py``)."""
    comm = engine.comm
    before = comm.world_size
    grid = engine_grid(engine)
    if grid is not None:  # (its world keeps its size: grid.world_change_refused)
        rebuild_grid(engine)
        if pipe.pipe_grid(engine) is not None:
            pipe.rebuild(engine)
    comm.rebind()
    if comm.world_size != before and grid is None:
        resize_batch(engine)
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


def resize_batch(engine) -> None:
    """The world changed size (a lost host): the batch triad as the config resolves for it, the
    rule a restart on that many ranks follows (a written train_batch_size is kept by changing the
    accumulation steps where it divides; else the global batch follows the world). Raises
    ConfigError when the config cannot run at that size."""
    source, origin = getattr(engine, "_config_source", (None, None))
    if source is None:
        raise RuntimeError("the engine's config source is unknown")
    cfg = resolve_engine_config(source, engine.module, origin=origin)
    engine._micro_batch = cfg.train_micro_batch_size_per_gpu
    engine._gas = cfg.gradient_accumulation_steps
    engine._train_batch = cfg.train_batch_size
    engine.tput_timer.batch_size = engine._train_batch
    engine.micro_steps = engine.global_steps * engine._gas


def rendezvous(engine, joining: bool) -> tuple:
    """Every member's completed step; then the first survivor's state to the newcomers. Returns
    (why the members cannot go on from one state or None, the members, the state or None)."""
    import torch.distributed as dist

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
    sources, why = state_sources(members)
    if why:
        return why, members, None
    state = None
    for held, src in sources.items():  # one broadcast per slice the newcomers need
        box = [engine_state(engine) if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src=src)
        if joining and held == slice_of(engine):
            state = box[0]
    return None, members, state


def state_sources(members: list) -> tuple:
    """({slice a newcomer needs: the survivor that sends it}, why not or None). A slice is the
    part of the model a member holds (``grid.slice_of``: its TP rank, its pipeline
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


def refuse(watch_or_path, why: str) -> None:
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
    word = watch.word
    why = unsupported(engine) or world_change_refused(engine, word)
    if why:
        refuse(watch, why)
    # this rank's main thread took the word (the launcher gives up at once on a survivor that does
    # not within the hang timeout: stuck outside any collective, it would never answer)
    watch.ack(status="recovering")
    t_abort = time.time()
    engine._abandon_step()  # before the state is sent (counters): the step starts again at micro 0
    join_group(word)
    t_group = time.time()
    why, members, state = rendezvous(engine, joining=False)
    if why:
        refuse(watch, why)
    try:
        take_world(engine)
    except Exception as exc:
        refuse(watch, f"the job cannot go on at world size {word['world_size']}: {exc}")
    if sharded(engine):
        why = recover_shards(engine, joining=False)
        if why:
            refuse(watch, why)
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
        refuse(path, why)
    t0 = time.time()
    join_group(word)
    t_group = time.time()
    why, _, state = rendezvous(engine, joining=True)
    if why or state is None:
        refuse(path, why or "no state came from the survivors")
    take_world(engine)
    load_engine_state(engine, state)
    if sharded(engine):
        why = recover_shards(engine, joining=True)
        if why:
            refuse(path, why)
    engine.strategy.zero_grad()
    if pipe.pipe_grid(engine) is not None:  # its own loader at the survivors' step
        pipe.position_loader(engine)
    watch = engine._recovery.watch
    if watch is not None:  # (it starts at the top of the script's loop: its calls are real ones)
        watch.joined = True
    if path:
        write_json(ack_path(path), {"epoch": word["epoch"], "status": "joined",
                                     "step": engine.global_steps,
                                     "seconds": {"rebuild": round(t_group - t0, 3),
                                                 "state": round(time.time() - t_group, 3)}})
