"""Checkpoint -> one plain fp32 ``state_dict`` (``dslaunch ckpt to-fp32``), and offline resharding
of a checkpoint to another world size (``dslaunch ckpt reshape``).

Both stream: rank files are opened with ``torch.load(mmap=True, weights_only=True)``, so only the
pages of the tensors being copied are read, and the output is built one parameter at a time; the
peak is about the output plus what the OS keeps cached of the shards, not several model copies.
Stage 0 and stages 1-2 in fp32 keep exact fp32 weights in ``model_states.pt``; for ZeRO 1-3 the
fp32 master shards (exact in bf16/fp16 too) are reassembled from the rank files.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from dslaunch.engine.checkpoint.save_load import (CheckpointError, _atomic_text, model_file,
                                                   rank_file, resolve_tag)
from dslaunch.engine.zero.partition import Layout
from dslaunch.engine.checkpoint.shard_index import ParamIndex, relayout, reshard


def _load(path: str):
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read checkpoint file ({type(e).__name__})") from None


def _meta(path: str) -> dict:
    mp = os.path.join(path, "metadata.json")
    try:
        with open(mp) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{mp}: checkpoint metadata not found") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mp}: cannot read checkpoint metadata ({e})") from None


class _RankFiles:
    """Lazily opened rank files of one checkpoint."""

    def __init__(self, path: str, world: int):
        self.path, self.world, self._open = path, world, {}

    def zero(self, rank: int) -> dict | None:
        if rank not in self._open:
            sd = _load(rank_file(self.path, rank))
            self._open[rank] = sd
        strat = self._open[rank].get("strategy") or {}
        return strat.get("zero") if isinstance(strat, dict) else None

    def raw(self, rank: int) -> dict:
        self.zero(rank)
        return self._open[rank]


def to_fp32(ckpt_dir: str, out: str, tag=None) -> dict:
    """Write the consolidated fp32 state_dict of ``ckpt_dir`` (tag or ``latest``) to ``out``.
    Returns {"tensors", "params_from_shards", "bytes"}."""
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    path = os.path.join(ckpt_dir, tag)
    meta = _meta(path)
    module = _load(model_file(path)).get("module")
    if not isinstance(module, dict):
        raise CheckpointError(f"{model_file(path)}: no 'module' weights")
    files = _RankFiles(path, int(meta.get("world_size", 1)))
    from_shards = {}
    z0 = files.zero(0) if int(meta.get("zero_stage") or 0) in (1, 2, 3) else None
    if z0 is not None:
        for gi, g in enumerate(z0["groups"]):
            idx = ParamIndex(Layout.from_meta(g["layout"]))
            shards = lambda k, gi=gi: files.zero(k)["groups"][gi]["master"]  # noqa: E731
            for name in idx.names():
                shape = idx.where[name][1].shape
                from_shards[name] = (idx, shards, shape)
    result, nbytes = {}, 0
    for name, t in module.items():
        if name in from_shards:
            idx, shards, shape = from_shards[name]
            v = idx.gather(shards, name).to(torch.float32).clone().view(shape)
            if tuple(v.shape) != tuple(t.shape):
                raise CheckpointError(f"{path}: tensor {name!r} is {list(t.shape)} in the model "
                                      f"file but {list(v.shape)} in the shards")
        else:
            v = t.to(torch.float32).clone() if t.is_floating_point() else t.clone()
        result[name] = v
        nbytes += v.numel() * v.element_size()
    tmp = os.fspath(out) + ".part"
    torch.save(result, tmp)
    os.replace(tmp, out)
    return {"tensors": len(result), "params_from_shards": len(from_shards), "bytes": nbytes}


def _reshaped_rank(files: _RankFiles, stage: int, world_size: int, r: int) -> dict:
    """Rank ``r``'s file content for ``world_size`` ranks, read piece by piece from the old files."""
    src = files.raw(r % files.world)
    if stage == 0:
        strategy = src["strategy"]  # stage 0: every rank holds the same optimizer state
    else:
        z0 = files.zero(0)
        groups = []
        for gi, g in enumerate(z0["groups"]):
            old = ParamIndex(Layout.from_meta(g["layout"]))
            new = relayout(old.layout, world_size)

            def shards_of(key, gi=gi):
                return lambda k: (files.zero(k)["groups"][gi]["master"] if key is None
                                  else files.zero(k)["groups"][gi]["state"][key])
            groups.append({
                "layout": new.meta(),
                "master": reshard(new, r, old, shards_of(None)),
                "state": {k: reshard(new, r, old, shards_of(k), v.dtype)
                          for k, v in g["state"].items()},
                "scalars": dict(g["scalars"])})
        z = dict(z0, world_size=world_size, rank=r, groups=groups)
        strategy = dict(src["strategy"], zero=z)
    return {"strategy": strategy, "rng": src.get("rng"), "rank": r, "world_size": world_size}


def reshape(ckpt_dir: str, out_dir: str, world_size: int, tag=None) -> str:
    """Copy a ZeRO 0-3 checkpoint to ``out_dir`` laid out for ``world_size`` ranks."""
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    path = os.path.join(ckpt_dir, tag)
    meta = _meta(path)
    stage, old_world = int(meta.get("zero_stage") or 0), int(meta["world_size"])
    if stage not in (0, 1, 2, 3):
        raise CheckpointError(f"{path}: ZeRO stage {stage} is not a stage dslaunch writes")
    files = _RankFiles(path, old_world)
    dst = os.path.join(out_dir, tag)
    tmp = os.path.join(out_dir, "." + tag + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copyfile(model_file(path), model_file(tmp))
    for r in range(world_size):
        # one new rank at a time; its shards are freed before the next one is built
        torch.save(_reshaped_rank(files, stage, world_size, r), rank_file(tmp, r))
    meta = dict(meta, world_size=world_size, dp_world_size=world_size,
                files=["model_states.pt"] + [os.path.basename(rank_file(tmp, r))
                                             for r in range(world_size)],
                reshaped_from=old_world)
    with open(os.path.join(tmp, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    _atomic_text(os.path.join(out_dir, "latest"), tag)
    return dst
