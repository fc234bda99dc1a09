"""ZeRO stage 3's ``model_states.pt`` holds no copy of the partitioned weights (as DeepSpeed's).

Their values are in the rank files already, once: the fp32 master shards (``zero_shards.py``;
in fp32 without masters, the parameter shards themselves). So a stage-3 save writes each
partitioned parameter in ``model_states.pt`` as an empty placeholder of its dtype (what
DeepSpeed's stage-3 model states hold) and lists them under ``zero3_partitioned``::

    {state_dict key: [name in the shards' layout, shape]}

(a tied weight's second key names the first one's shard). Buffers and what ZeRO does not
partition (frozen parameters) stay there whole. Nothing is gathered to save. fp32 Adam: 12 bytes
per parameter on disk (master, exp_avg, exp_avg_sq), not 16.

Readers of such a ``module``:
- a stage-3 training engine (``load_shard_weights``): this rank's shard of the weights, read
  piece by piece from the old shards whatever world size or bucket layout saved them; the
  optimizer state is left alone (``load_module_only``, ``load_optimizer_states=False``);
- any other engine (stages 0-2, a forward-only stage 3, another AutoTP size):
  ``full_module_state``, each placeholder filled with its whole parameter gathered from the
  shards (under AutoTP from each TP rank's shards, slices put back together);
- consolidation (``zero_to_fp32_script.zero_checkpoint``, torch only) reads the list itself.
A strategy whose rank files hold no shards (forward-only stage 3) saves the whole weights.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch

from dslaunch.engine.storage.files import CheckpointError, RankFiles

PARTITIONED = "zero3_partitioned"


def _layout_params(zero: dict) -> dict:
    """{name: shape} of every parameter the shards of one rank file's groups hold."""
    return {name: list(shape) for g in zero["groups"] for b in g["layout"]["buckets"]
            for name, shape, *_ in b["params"]}


def partitioned_module_state(strategy, strategy_sd: dict):
    """(``model_states`` module state with placeholders, ``zero3_partitioned``), or None when
    the rank files will not hold the weights (not stage 3, or no shards: forward only)."""
    z = strategy_sd.get("zero") if isinstance(strategy_sd, dict) else None
    if getattr(strategy, "stage", None) != 3 or not z or not z.get("groups"):
        return None
    in_shards = _layout_params(z)
    name_of = {id(p): n for g in strategy.groups for n, p in g.params.items() if n in in_shards}
    module, part = {}, {}
    for k, v in strategy.model.state_dict(keep_vars=True).items():
        name = name_of.get(id(v))
        if name is None:
            module[k] = v.detach().clone()
        else:
            module[k] = torch.empty(0, dtype=v.dtype)
            part[k] = [name, in_shards[name]]
    return module, part


def shapes(part: dict) -> dict:
    """{state_dict key: shape} of the placeholders (for the shape checks of a load)."""
    return {k: tuple(shape) for k, (_, shape) in part.items()}


def full_module_state(path: str, meta: dict, module: dict, part: dict) -> dict:
    """``module`` with every placeholder replaced by its whole parameter (the shards' values:
    fp32 masters), read from the checkpoint's rank files (mapped: only what is copied is read).
    Under AutoTP each rank file holds a partition of its TP rank's slices, not of the whole
    model: the slices are gathered per TP rank and put back whole
    (``zero_to_fp32_script.autotp_checkpoint``); a caller that holds slices cuts its own."""
    from dslaunch.engine.storage.shard_index import gather_master, param_locations
    from dslaunch.engine.storage.zero_to_fp32_script import autotp_checkpoint, autotp_size

    if autotp_size(meta) > 1:
        whole = autotp_checkpoint(path, meta)
        return {**module, **{k: whole[k] for k in part}}
    files = RankFiles(path, int(meta.get("world_size", 1)))
    where = param_locations(files.zero(0))
    out = dict(module)
    for k, (name, shape) in part.items():
        if name not in where:
            raise CheckpointError(f"{path}: tensor {k!r} ({name!r}) is in none of the ZeRO "
                                  "shards of the rank files")
        out[k] = gather_master(files, where, name).reshape(shape).clone()
    return out


def load_shard_weights(strategy, path: str, world: int) -> bool:
    """A stage-3 training strategy's own weights from a stage-3 checkpoint's shards (any
    layout): its fp32 masters and parameter shards set, the persistent parameters re-gathered;
    the optimizer state untouched. False (nothing done) when the checkpoint's shards do not
    cover the strategy's parameters group by group (the caller then loads whole weights).
    Every rank decides alike (same files, same layout), so the collectives match."""
    from dslaunch.engine.storage.zero_shards import data_ranks, global_names, old_index, put_master, reshard_group

    if getattr(strategy, "stage", None) != 3 or getattr(strategy, "optimizer", None) is None:
        return False
    files = RankFiles(path, world)
    with open(os.path.join(path, "metadata.json")) as f:
        members = data_ranks(json.load(f), world)  # under AutoTP: this rank's TP rank's files
    z0 = files.zero(members[0])
    if z0 is None or len(z0["groups"]) != len(strategy.groups):
        return False
    names = global_names(strategy)
    wheres = [old_index(files, gi, world, members) for gi in range(len(strategy.groups))]
    for g, where in zip(strategy.groups, wheres):
        if any(names.get(s.name, s.name) not in where for b in g.layout.buckets
               for s in b.slots):
            return False
    # NVMe: the masters live in a file; in memory (and written back) for this block
    masters_in = getattr(strategy, "masters_in", None)
    with masters_in(write=True) if masters_in else contextlib.nullcontext():
        for gi, (g, where) in enumerate(zip(strategy.groups, wheres)):
            def shard_of(rank, gi=gi):
                return files.zero(rank)["groups"][gi]["master"]
            dtype = g.master.dtype if g.master is not None else torch.float32
            put_master(g, reshard_group(g, where, names, shard_of, dtype))
        strategy._all_gather_params()
    return True
