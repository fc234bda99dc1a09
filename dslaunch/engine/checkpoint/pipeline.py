"""Checkpoints of a pipeline / tensor-parallel layout (``PipelineEngine``), crash-safe like
``save_load.py``.

Layout of ``<dir>/<tag>/``:
- ``layer_stage{S:02d}_tp{T:02d}_model_states.pt``: the weights of pipeline stage S, TP rank T
  (written by that position's data-parallel rank 0; keys are the global layer indices, so a
  stage's file names the layers it holds);
- ``rank_{r}_optim_states.pt`` (every rank): strategy state (optimizer, masters) and RNG states;
- ``engine_states.pt`` (rank 0): counters, LR scheduler, loss scaler, client_state;
- ``metadata.json`` (rank 0): format, layout (pipe, tp, dp, world size, layer partition), files,
  and ``shards["S_T"]``: ``splits`` (for each TP-split parameter: dim, full size, row ranges),
  ``param_names`` (trainable parameters in the strategy's order) and ``frozen_params``, which
  ``consolidate.py`` (``dslaunch ckpt to-fp32``) needs to rebuild one plain state_dict.
``<dir>/zero_to_fp32.py`` (rank 0) consolidates with torch alone.
Everything is written into ``<dir>/.<tag>.tmp/``, renamed after a world barrier, ``latest`` last.
Loading needs the same layout (pipe, tp, dp and partition); anything else is a
``CheckpointError`` that says what differs: to change the layout, convert it with ``dslaunch
ckpt to-universal`` and load that folder (``pipe_universal.py``: any layout).
"""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from dslaunch.engine.storage.files import (
    CheckpointError,
    atomic_text,
    atomic_torch_save,
    dslaunch_version,
    find_tag,
    load_file,
    publish_dir,
    rank_file,
    save_tag,
    start_save_dir,
    write_to_fp32_script,
)
from dslaunch.engine.storage.module_state import check_module, without_frozen
from dslaunch.engine.storage.pipe_files import FORMAT, layer_file
from dslaunch.engine.storage.rng import rng_state, set_rng_state


def _layout(engine) -> dict:
    g = engine.grid
    return {"pipe": g.num_stages, "tp": g.tp_world_size, "dp": g.dp_world_size,
            "world_size": dist.get_world_size(), "parts": list(engine.module.parts)}


def _shard_info(engine):
    """What consolidation needs of this (stage, TP rank), from its data-parallel rank 0."""
    g = engine.grid
    if g.dp_rank != 0:
        return None
    splits = {n: {"dim": p.partition_dim, "full": p.tp_full, "ranges": p.tp_ranges}
              for n, p in engine.module.named_parameters()
              if getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_ranges")}
    names = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    frozen = [n for n, p in engine.module.named_parameters() if not p.requires_grad]
    return {"stage": g.stage_id, "tp": g.tp_rank,
            "info": {"splits": splits, "param_names": names, "frozen_params": frozen}}


def save(engine, save_dir, tag=None, client_state=None, save_latest=True,
         exclude_frozen_parameters=False) -> bool:
    save_dir = os.fspath(save_dir)
    tag = save_tag(engine, tag)
    rank, g = dist.get_rank(), engine.grid
    final, tmp = start_save_dir(save_dir, tag, rank)
    dist.barrier()
    if g.dp_rank == 0:
        weights = engine.strategy.module_state_dict()
        if exclude_frozen_parameters:
            weights = without_frozen(weights, engine.module)
        atomic_torch_save(weights, layer_file(tmp, g.stage_id, g.tp_rank))
    atomic_torch_save({"strategy": engine.strategy.state_dict(), "rng": rng_state(),
                       "rank": rank, "world_size": dist.get_world_size()}, rank_file(tmp, rank))
    if rank == 0:
        sched = engine.lr_scheduler
        atomic_torch_save({
            "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps,
            "lr_scheduler": sched.state_dict() if sched is not None else None,
            "loss_scaler": engine.precision.scaler.state_dict(),
            "client_state": client_state or {}}, os.path.join(tmp, "engine_states.pt"))
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, _shard_info(engine))
    dist.barrier()
    if rank == 0:
        layout = _layout(engine)
        files = ([os.path.basename(layer_file(tmp, s, t)) for s in range(layout["pipe"])
                  for t in range(layout["tp"])] + ["engine_states.pt"]
                 + [os.path.basename(rank_file(tmp, r)) for r in range(layout["world_size"])])
        meta = {"format": FORMAT, "tag": tag, **layout, "zero_stage": engine.zero_stage,
                "dtype": engine.precision.name, "global_steps": engine.global_steps,
                "dslaunch_version": dslaunch_version(), "files": files,
                "shards": {f"{i['stage']}_{i['tp']}": i["info"] for i in shards if i}}
        atomic_text(os.path.join(tmp, "metadata.json"), json.dumps(meta, indent=1))
        publish_dir(tmp, final)  # a tag saved again stays whole until the new one is in place
        write_to_fp32_script(save_dir)
        if save_latest:
            atomic_text(os.path.join(save_dir, "latest"), tag)
    dist.barrier()
    return True


def load(engine, load_dir, tag=None, strict=True, load_optimizer_states=True,
         load_lr_scheduler_states=True, load_module_only=False):
    from dslaunch.engine.checkpoint.universal import is_universal_checkpoint, load_universal_checkpoint, universal_tag

    load_dir = os.fspath(load_dir)
    if tag is None:  # checkpoint.load_universal: DeepSpeed's latest_universal names the tag
        tag = universal_tag(load_dir, engine._config.checkpoint.load_universal)
    tag = find_tag(load_dir, tag)
    if tag is None:  # nothing to resume from (DeepSpeed's answer)
        return None, None
    path = os.path.join(load_dir, tag)
    if is_universal_checkpoint(path):  # whole parameters: any layout (pipe_universal.py)
        return load_universal_checkpoint(engine, path, strict, load_optimizer_states,
                                         load_lr_scheduler_states, load_module_only)
    meta_path = os.path.join(path, "metadata.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta_path}: cannot read ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a pipeline/TP checkpoint (format "
                              f"{meta.get('format')!r})")
    mine = _layout(engine)
    diff = [f"{k} {meta.get(k)} (now {v})" for k, v in mine.items() if meta.get(k) != v]
    if diff:
        raise CheckpointError(f"{path}: saved with another layout: " + ", ".join(diff)
                              + "; to load it at this layout, convert it with 'dslaunch ckpt "
                              "to-universal' and load the universal folder")
    g = engine.grid
    layer_path = layer_file(path, g.stage_id, g.tp_rank)
    sd = load_file(layer_path)
    check_module(sd, engine.module, layer_path, strict)
    engine.strategy.load_module_state_dict(sd, strict=strict)
    if load_module_only:
        engine.strategy.sync_from_model()
        return path, {}
    states = load_file(os.path.join(path, "engine_states.pt"))
    rank_sd = load_file(rank_file(path, dist.get_rank()))
    engine.strategy.load_state_dict(rank_sd["strategy"], load_optimizer_states)
    for key in ("global_steps", "global_samples", "micro_steps", "skipped_steps"):
        setattr(engine, key, int(states[key]))
    if load_lr_scheduler_states and engine.lr_scheduler is not None and states["lr_scheduler"]:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    engine.precision.scaler.load_state_dict(states["loss_scaler"])
    set_rng_state(rank_sd["rng"])
    return path, states.get("client_state") or {}
