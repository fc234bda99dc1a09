"""Save and load of the engine (``DSLaunchEngine``), crash-safe; DeepSpeed's
``save_16bit_model``.

Layout of ``<dir>/<tag>/`` (default tag ``global_step{N}``):
- ``model_states.pt`` (rank 0): module weights, step counters, lr scheduler, loss scaler,
  client_state. ZeRO 3: the partitioned weights only as empty placeholders (their values are
  the rank files' shards, ``zero3_module.py``), so nothing is gathered to save.
- ``rank_{r}_optim_states.pt`` (every rank): that rank's strategy state (optimizer, fp32 masters,
  a ZeRO shard) and its RNG states (torch, CUDA, python ``random``, numpy when imported).
- ``layer_{l}_expert_{e}_mp_rank_00_model_states.pt`` (MoE): one expert's weights by global id,
  written by one of its replicas (``expert_files.py``); ``model_states.pt`` then holds the dense
  weights only.
- ``metadata.json`` (rank 0): world size, ZeRO stage, dtype, dslaunch version, file list, the
  frozen parameters' names (MoE: ``expert_parallel``, the ep size of each expert group).
``<dir>/latest`` holds the newest tag; ``<dir>/zero_to_fp32.py`` consolidates with torch alone.

Crash safety: every rank writes into ``<dir>/.<tag>.tmp/`` (each file written under a temporary
name and renamed); after a barrier rank 0 renames the directory to ``<dir>/<tag>`` and only then
rewrites ``latest`` (temporary file + ``os.replace``). A process that dies before the rename
leaves the previous checkpoint and ``latest`` untouched; a stale ``.tmp`` directory is removed
by the next save. (Assumes ``<dir>`` is one shared filesystem for all ranks, as DeepSpeed does.)
``async_save``: the same files, written by a background thread per rank (``async_save.py``);
``keep_last``: older tags pruned after the publish (``retention.py``). After a complete save
each rank records it in its progress record (``dslaunch.progress_record``), after a load too.

Files are read with ``torch.load(weights_only=True)`` (``files.load_file``); anything unreadable
is an error that names the file.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from dslaunch import progress_record
from dslaunch.engine.checkpoint.autotp_states import autotp_meta, load_resplit_optimizer, tp_size_changed
from dslaunch.engine.checkpoint.deepspeed_format import is_deepspeed_checkpoint, load_deepspeed_checkpoint
from dslaunch.engine.checkpoint.expert_files import EXPERT_FILE, split_module_state, with_local_experts
from dslaunch.engine.checkpoint.universal import is_universal_checkpoint, load_universal_checkpoint, universal_tag
from dslaunch.engine.checkpoint.zero3_module import (
    PARTITIONED,
    full_module_state,
    load_shard_weights,
    partitioned_module_state,
)
from dslaunch.engine.checkpoint.zero3_module import shapes as zero3_shapes
from dslaunch.engine.features.data_sampling import load_sampler_state, sampler_state
from dslaunch.engine.features.random_ltd.convert import remove_random_ltd_state_dict, with_random_ltd_names
from dslaunch.engine.parallel.autotp import gather_tp_state, slice_tp_state
from dslaunch.engine.storage.async_save import AsyncSaver, live_storages, snapshot, write_files
from dslaunch.engine.storage.files import (
    CheckpointError,
    atomic_text,
    atomic_torch_save,
    crash_point,
    dslaunch_version,
    find_tag,
    fsync_dir,
    load_file,
    model_file,
    publish_dir,
    rank_file,
    read_meta,
    save_tag,
    start_save_dir,
    write_to_fp32_script,
)
from dslaunch.engine.storage.module_state import check_module, without_frozen
from dslaunch.engine.storage.retention import prune
from dslaunch.engine.storage.rng import rng_state, set_rng_state
from dslaunch.engine.storage.zero_shards import STAGING

# -- save --------------------------------------------------------------------------------------

def save_checkpoint(engine, save_dir, tag=None, client_state=None, save_latest=True,
                    exclude_frozen_parameters=False, async_save=None, keep_last=None) -> bool:
    """Every rank calls it. ``async_save`` / ``keep_last`` None: the config's
    ``checkpoint.async_save`` / ``checkpoint.keep_last``. Asynchronous: returns once the state is
    copied to host memory; ``async_save.py`` writes and publishes it."""
    section = engine._config.checkpoint
    async_save = section.async_save if async_save is None else bool(async_save)
    keep_last = section.keep_last if keep_last is None else int(keep_last)
    saver = async_saver(engine)
    saver.wait()  # a save still in flight is published first, on every rank
    save_dir = os.fspath(save_dir)
    tag = save_tag(engine, tag)
    comm, rank = engine.comm, engine.global_rank
    final, tmp = start_save_dir(save_dir, tag, rank)
    _job_barrier(comm)

    if async_save:  # ZeRO shards are gathered straight into the reused host buffers
        saver.staging.begin()
        token = STAGING.set(saver.staging.alloc)
        try:
            files = _rank_files(engine, tmp, client_state, exclude_frozen_parameters)
        finally:
            STAGING.reset(token)
    else:
        files = _rank_files(engine, tmp, client_state, exclude_frozen_parameters)
    meta = _metadata(engine, tag, tmp) if rank == 0 else None
    step = engine.global_steps

    def publish():
        _publish(save_dir, tag, tmp, final, meta, save_latest, keep_last)

    if async_save:
        # later steps change the live tensors in place: copy what shares their memory
        files = snapshot(files, live_storages(engine.module, engine.optimizer, engine.strategy),
                         saver.staging)
        crash_point("before_files", rank)
        saver.start(files, tmp, publish, step, _record_saved)
        return True
    crash_point("before_files", rank)
    write_files(files, rank)
    _job_barrier(comm)
    if rank == 0:
        publish()
    _job_barrier(comm)
    _record_saved(step)
    return True


def _job_barrier(comm) -> None:
    """Every rank of the job, not only ``comm``'s: a tensor- or pipeline-parallel engine's comm is
    its data-parallel group, and rank 0 must not publish the folder before the other groups'
    ranks wrote into it (a TP 2 x DP 2 save lost rank 3's file that way)."""
    import torch.distributed as dist

    if dist.is_initialized() and comm.world_size != dist.get_world_size():
        dist.barrier()
    else:
        comm.barrier()


def async_saver(engine) -> AsyncSaver:
    saver = getattr(engine, "_async_saver", None)
    if saver is None:
        saver = engine._async_saver = AsyncSaver(engine.comm, engine.global_rank,
                                                 engine.world_size, engine.device)
    return saver


def _rank_files(engine, tmp: str, client_state, exclude_frozen_parameters) -> dict:
    """``{path: object}`` this rank writes (every rank calls it: stage 3 gathers the weights)."""
    strategy, rank = engine.strategy, engine.global_rank
    strategy_sd = strategy.state_dict()
    # stage 3: the weights are in the rank files' shards; model_states only names them
    # (zero3_module.py). Elsewhere every rank takes part in the gather of the whole weights
    partitioned = partitioned_module_state(strategy, strategy_sd)
    module_sd, part = partitioned if partitioned else (strategy.module_state_dict(), None)
    if not partitioned:  # AutoTP: model_states holds it whole (stage 3: names only)
        module_sd = gather_tp_state(module_sd, engine.module)
    if not partitioned:  # random-LTD: the model's own names, without the wrappers (DeepSpeed's)
        module_sd = remove_random_ltd_state_dict(module_sd)
    if exclude_frozen_parameters:
        module_sd = without_frozen(module_sd, engine.module)
    # MoE: each expert in a file of its own (expert_files.py), written by one of its replicas
    module_sd, expert_sds = split_module_state(engine, module_sd)
    files = {os.path.join(tmp, name): sd for name, sd in expert_sds.items()}
    if rank == 0:
        sched = engine.lr_scheduler
        client = dict(client_state or {})
        states = {
            "module": module_sd,
            "global_steps": engine.global_steps,
            "global_samples": engine.global_samples,
            "micro_steps": engine.micro_steps,
            **_batch_info(engine),
            "skipped_steps": engine.skipped_steps,
            "lr_scheduler": sched.state_dict() if sched is not None else None,
            "random_ltd": engine._random_ltd_state(),
            "data_sampler": sampler_state(engine),  # curriculum data sampling's place in the data
            "loss_scaler": engine.precision.scaler.state_dict(),
            "client_state": client,
            "dslaunch_version": dslaunch_version(),
        }
        if part:
            states[PARTITIONED] = part
        # the client state at the top level too, where DeepSpeed puts it and readers of its
        # files look (Lightning's zero-to-fp32 conversion); pickled once, the objects are shared
        states.update({k: v for k, v in client.items() if k not in states})
        files[model_file(tmp)] = states
    # "optimizer_state_dict"/"zero_stage": where readers of DeepSpeed's files find the stage
    files[rank_file(tmp, rank)] = {"strategy": strategy_sd, "rng": rng_state(),
                                   "rank": rank, "world_size": engine.world_size,
                                   "optimizer_state_dict": {"zero_stage": engine.zero_stage}}
    return files


def _batch_info(engine) -> dict:
    """How the global batch was split when saving (a resume at another world size logs what
    changed: ``_log_layout_change``)."""
    return {"world_size": engine.world_size, "dp_world_size": engine.dp_world_size,
            "train_batch_size": engine.train_batch_size(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "elasticity": bool(engine._config.elasticity.enabled)}


def _metadata(engine, tag: str, tmp: str) -> dict:
    return {"format": "dslaunch-checkpoint/1", "tag": tag, **_batch_info(engine),
            "zero_stage": engine.zero_stage, "dtype": engine.precision.name,
            "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "dslaunch_version": dslaunch_version(),
            "files": ["model_states.pt"] + [os.path.basename(rank_file(tmp, r))
                                            for r in range(engine.world_size)]
            + [EXPERT_FILE.format(*e) for e in _all_experts(engine)],
            **_expert_parallel(engine),
            **autotp_meta(engine),  # AutoTP: what another TP size needs to re-split
            # for zero_to_fp32's exclude_frozen_parameters
            "frozen_params": [n for n, p in engine.module.named_parameters()
                              if not p.requires_grad]}


def _all_experts(engine) -> list:
    groups = getattr(engine, "expert_groups", None)
    return groups.all_experts(engine.module) if groups else []


def _expert_parallel(engine) -> dict:
    """MoE: {"expert_parallel": {group name: ep size}} (nothing without experts)."""
    groups = getattr(engine, "expert_groups", None)
    return {"expert_parallel": dict(groups.ep_size)} if groups else {}


def _publish(save_dir, tag, tmp, final, meta, save_latest, keep_last) -> None:
    """Rank 0, once every rank's files are complete: metadata, the directory in place,
    ``latest`` last, then the old tags pruned."""
    meta = dict(meta, saved_at=time.time())
    atomic_text(os.path.join(tmp, "metadata.json"), json.dumps(meta, indent=1))
    crash_point("before_rename")
    publish_dir(tmp, final)
    write_to_fp32_script(save_dir)
    if save_latest:
        crash_point("before_latest")
        atomic_text(os.path.join(save_dir, "latest"), tag)
        fsync_dir(save_dir)
    if keep_last:
        prune(save_dir, keep_last, _latest_tag(save_dir))


def _latest_tag(save_dir: str):
    try:
        with open(os.path.join(save_dir, "latest")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _record_saved(step: int) -> None:
    """The launcher's restart policy reads it (``progress_record``): a complete save."""
    w = progress_record.writer()
    if w is not None:
        w.checkpoint_saved(step)


# -- load --------------------------------------------------------------------------------------

def load_checkpoint(engine, load_dir, tag=None, strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True, load_module_only=False):
    """Returns ``(path, client_state)`` as DeepSpeed does; ``(None, None)`` (and a warning)
    when no tag is given and ``load_dir`` has no ``latest`` file. A checkpoint written by
    DeepSpeed (ZeRO 1-3) loads too (``deepspeed_format.py``), and a universal one
    (``universal.py``; ``checkpoint.load_universal`` makes tag None read ``latest_universal``)."""
    async_saver(engine).wait()  # a save of ours still in flight is published first
    load_dir = os.fspath(load_dir)
    if tag is None:  # checkpoint.load_universal: DeepSpeed's latest_universal names the tag
        tag = universal_tag(load_dir, engine._config.checkpoint.load_universal)
    tag = find_tag(load_dir, tag)
    if tag is None:
        return None, None
    path = os.path.join(load_dir, tag)
    if is_universal_checkpoint(path):  # DeepSpeed's universal format (universal.py)
        loaded = load_universal_checkpoint(engine, path, strict, load_optimizer_states,
                                           load_lr_scheduler_states, load_module_only)
    elif is_deepspeed_checkpoint(path):  # a run moving over from DeepSpeed
        loaded = load_deepspeed_checkpoint(engine, path, strict, load_optimizer_states,
                                           load_lr_scheduler_states, load_module_only)
    else:
        loaded = _load(engine, path, strict, load_optimizer_states, load_lr_scheduler_states,
                       load_module_only)
    w = progress_record.writer()
    if w is not None:
        w.checkpoint_loaded(engine.global_steps)
    return loaded


def _load(engine, path, strict, load_optimizer_states, load_lr_scheduler_states,
          load_module_only):
    meta = read_meta(path)
    mpath = model_file(path)
    states = load_file(mpath, mmap=True)  # only copied into the model: no second copy of it
    if not isinstance(states, dict) or "module" not in states:
        raise CheckpointError(f"{mpath}: not a dslaunch model checkpoint (no 'module')")
    module_sd = with_local_experts(engine, states["module"], path)  # MoE: this rank's experts
    module_sd = with_random_ltd_names(module_sd, engine.module)  # saved without the wrappers
    part = states.get(PARTITIONED) or {}
    if part and tp_size_changed(engine, meta):
        # stage 3 + AutoTP at another TP size: the TP slices put back whole from each TP
        # rank's shards (the fp32 masters), then cut as this job splits them
        whole = full_module_state(path, meta, module_sd, part)
        module_sd, part = slice_tp_state(whole, engine.module), {}
    elif part:  # stage 3: a partitioned weight's shards already hold this TP rank's slices
        whole = {k: v for k, v in module_sd.items() if k not in part}
        module_sd = {**module_sd, **slice_tp_state(whole, engine.module)}
    else:
        module_sd = slice_tp_state(module_sd, engine.module)  # AutoTP: this rank's slices
    check_module(module_sd, engine.module, mpath, strict, zero3_shapes(part))
    _load_module(engine, path, meta, module_sd, part, strict)
    if load_module_only:
        return path, states.get("client_state", {})

    same_world = meta.get("world_size") == engine.world_size
    if load_optimizer_states and engine._trains:  # none: forward-only engine
        _load_optimizer_states(engine, path, meta)
    if load_lr_scheduler_states and engine.lr_scheduler is not None and states.get("lr_scheduler"):
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    engine._load_random_ltd_state(states.get("random_ltd"))
    load_sampler_state(engine, states.get("data_sampler"))
    if states.get("loss_scaler"):
        engine.precision.scaler.load_state_dict(states["loss_scaler"])
    engine.global_steps = int(states["global_steps"])
    engine.global_samples = int(states["global_samples"])
    engine.micro_steps = int(states["micro_steps"])
    gas = engine.gradient_accumulation_steps()
    saved_gas = states.get("gradient_accumulation_steps")
    # (older checkpoints lack it: a new world size is then the sign of another batch split)
    if (saved_gas != gas) if saved_gas is not None else not same_world:
        # the same global batch split otherwise: restart the accumulation window on a boundary
        # (accumulated gradients are not saved anyway), or the next steps would fall mid-window
        engine.micro_steps = engine.global_steps * gas
    engine.skipped_steps = int(states.get("skipped_steps", 0))
    engine.strategy.zero_grad()
    if engine.global_rank == 0:
        _log_layout_change(path, meta, states, engine)
    return path, states.get("client_state", {})


def _load_module(engine, path: str, meta: dict, module_sd: dict, part: dict, strict) -> None:
    """The weights into the engine. A stage-3 checkpoint's partitioned weights are in its
    shards (``zero3_module.py``): a stage-3 engine reads only its own shard of them, any other
    gets them whole."""
    world = int(meta.get("world_size", 1))
    if part and load_shard_weights(engine.strategy, path, world):
        with torch.no_grad():  # buffers and frozen parameters: whole in model_states
            engine.module.load_state_dict({k: v for k, v in module_sd.items() if k not in part},
                                          strict=False)
        return
    if part:  # (under AutoTP: whole, then this rank's slices)
        module_sd = slice_tp_state(full_module_state(path, meta, module_sd, part), engine.module)
    engine.strategy.load_module_state_dict(module_sd, strict=strict)
    engine.strategy.sync_from_model()


def _log_layout_change(path: str, meta: dict, states: dict, engine) -> None:
    """One line on stderr when the job resumes with another world size or batch split."""
    now = _batch_info(engine)
    saved = {k: states.get(k, meta.get(k)) for k in now}
    if saved["world_size"] == now["world_size"] and saved["gradient_accumulation_steps"] in (
            None, now["gradient_accumulation_steps"]):
        return

    def split(b):
        head = (f"world size {b['world_size']}, micro {b['train_micro_batch_size_per_gpu']} x "
                f"accumulation {b['gradient_accumulation_steps']} x data-parallel "
                f"{b['dp_world_size']}")
        samples = _samples(b)
        if samples is None or samples == b["train_batch_size"]:
            return f"{head} = batch {b['train_batch_size']}"
        return (f"{head} = {samples} samples a step (train_batch_size {b['train_batch_size']} "
                "counts the tensor-parallel ranks too)")
    # AutoTP: train_batch_size counts the TP ranks too (DeepSpeed's count); the samples a step
    # trains on are micro x accumulation x data-parallel
    same = saved["train_batch_size"] in (None, now["train_batch_size"]) or (
        _samples(saved) is not None and _samples(saved) == _samples(now))
    print(f"[dslaunch] resumed {path}: saved with {split(saved)}; now {split(now)}"
          + (" (optimizer state resharded)" if saved["world_size"] != now["world_size"] and
             engine.zero_stage in ZERO_STAGES else "")
          + ("; the global batch is the same" if same else
             "; the global batch CHANGED (set elasticity, or train_batch_size with "
             "train_micro_batch_size_per_gpu, to keep it)"), file=sys.stderr, flush=True)


def _samples(b: dict):
    try:
        return (int(b["train_micro_batch_size_per_gpu"]) * int(b["gradient_accumulation_steps"])
                * int(b["dp_world_size"]))
    except (KeyError, TypeError, ValueError):
        return None


ZERO_STAGES = (1, 2, 3)  # one shard format (zero_shards.py): any of them reads any other


def _same_shard_layout(rstate, strategy) -> bool:
    """Whether a rank file's shards are laid out exactly as ``strategy`` lays out its own."""
    from dslaunch.engine.storage.zero_shards import global_names, saved_meta

    try:
        saved = [g["layout"] for g in rstate["strategy"]["zero"]["groups"]]
    except (KeyError, TypeError):
        return True  # not a shard file: load_state_dict says what is wrong with it
    names = global_names(strategy)
    return saved == [saved_meta(g, names) for g in strategy.groups]


def _load_optimizer_states(engine, path: str, meta: dict) -> None:
    """Restore the strategy's optimizer state (fp32 masters, optimizer moments, step) and, when
    the world size is unchanged, this rank's RNG states.

    ZeRO 1-3 checkpoints are resharded on load whenever this job lays the shards out otherwise
    (another world size, another stage among 1-3, another bucket size): each rank reads only the
    pieces of the old shards that fall in its new shard. A stage 0 checkpoint holds the same
    optimizer state on every rank, so a stage 0 job of any size reads one of them."""
    strategy, rank = engine.strategy, engine.global_rank
    saved_world, saved_stage = meta.get("world_size"), meta.get("zero_stage")
    same_world = saved_world == engine.world_size
    if tp_size_changed(engine, meta):  # AutoTP saved at another TP size (autotp_states.py)
        load_resplit_optimizer(engine, path, meta)
        return
    if (saved_stage in ZERO_STAGES and engine.zero_stage in ZERO_STAGES
            and hasattr(strategy, "load_resharded")):
        rstate = load_file(rank_file(path, rank), mmap=True) if same_world else None
        if rstate is None or not _same_shard_layout(rstate, strategy):
            try:
                strategy.load_resharded(path)
            except (KeyError, ValueError, RuntimeError) as e:
                raise CheckpointError(f"{path}: cannot reshard the optimizer state ({e})") \
                    from None
            if rstate is not None:
                set_rng_state(rstate["rng"])
            return
    elif (saved_stage == engine.zero_stage == 0 and getattr(engine, "expert_groups", None)
          and (not same_world or meta.get("expert_parallel") != _expert_parallel(engine).get(
              "expert_parallel"))):
        raise CheckpointError(
            f"{path}: ZeRO stage 0 optimizer states of MoE experts are kept per rank and do not "
            "carry to another world size or ep_size; save with ZeRO stage 1 or 2 (its states "
            "reshard by expert), or load with load_optimizer_states=False")
    elif saved_stage == engine.zero_stage == 0 and _plain_stage0(strategy) and not same_world:
        rstate = load_file(rank_file(path, rank % int(saved_world)))
        _strategy_load(strategy, rstate, rank_file(path, rank % int(saved_world)))
        return
    elif not (same_world and saved_stage == engine.zero_stage):
        raise CheckpointError(
            f"{os.path.join(path, 'metadata.json')}: saved with world size {saved_world} and "
            f"ZeRO stage {saved_stage}, this job has {engine.world_size} and stage "
            f"{engine.zero_stage}; only ZeRO stages 1-3 convert between each other; load with "
            "load_optimizer_states=False (weights only)")
    else:
        rstate = load_file(rank_file(path, rank))
    # same world size and shard layout: this rank's own file, as saved
    _strategy_load(strategy, rstate, rank_file(path, rank))
    set_rng_state(rstate["rng"])


def _plain_stage0(strategy) -> bool:
    """Stage 0's optimizer state is the same on every rank; the 1-bit optimizers' error feedback
    (a subclass) is per rank and does not carry to another world size."""
    from dslaunch.engine.zero.stage0 import Stage0Strategy

    return type(strategy) is Stage0Strategy


def _strategy_load(strategy, rstate, rpath: str) -> None:
    try:
        strategy.load_state_dict(rstate["strategy"], load_optimizer_states=True)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{rpath}: optimizer state does not fit ({e})") from None


def save_16bit_model(engine, save_dir: str, save_filename: str = "pytorch_model.bin",
                     exclude_frozen_parameters: bool = False) -> bool:
    """DeepSpeed's ``save_16bit_model``: rank 0 writes the whole model's weights in the training
    dtype (bf16/fp16; fp32 when training in fp32) as one plain ``state_dict`` file. Every rank must
    call it: under ZeRO stage 3 the weights are gathered bucket by bucket, and only when
    ``stage3_gather_16bit_weights_on_model_save`` is true (as in DeepSpeed; otherwise nothing is
    written, a note says why, and the result is False)."""
    strategy = engine.strategy
    if strategy.stage == 3 and not strategy.zero.stage3_gather_16bit_weights_on_model_save:
        if engine.global_rank == 0:
            print("[dslaunch] save_16bit_model: nothing saved: under ZeRO stage 3 set "
                  "zero_optimization.stage3_gather_16bit_weights_on_model_save to true (or "
                  "consolidate a checkpoint with `dslaunch ckpt to-fp32`)", file=sys.stderr,
                  flush=True)
        return False
    state = strategy.module_state_dict()  # every rank takes part (stage 3 gathers)
    state = gather_tp_state(state, engine.module)  # tensor-parallel slices put back together
    if engine.global_rank == 0:
        if exclude_frozen_parameters:
            state = without_frozen(state, engine.module)
        os.makedirs(save_dir, exist_ok=True)
        atomic_torch_save({k: v.detach().cpu().clone() for k, v in state.items()},
                          os.path.join(save_dir, save_filename))
    engine.comm.barrier()
    return True
