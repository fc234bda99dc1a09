"""``dslaunch ckpt reshape``: a ZeRO 0-3 checkpoint rewritten offline for another world size.

Not needed to resume: ``load_checkpoint`` reshards ZeRO 1-3 on load (``zero_shards.py``
``load_resharded``) and a stage 0 job reads any rank's file. The new rank files are built one
at a time from the old ones opened with mmap (``files.RankFiles``) with the range arithmetic of
``shard_index.py``, so the peak is about one new rank's shard plus what the OS keeps cached.
``model_states.pt`` is copied as it is; ``metadata.json`` records ``reshaped_from``.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from dslaunch.engine.base.partition import Layout
from dslaunch.engine.storage.files import (
    CheckpointError,
    RankFiles,
    atomic_text,
    model_file,
    rank_file,
    read_meta,
    resolve_tag,
)
from dslaunch.engine.storage.shard_index import ParamIndex, relayout, reshard


def _reshaped_rank(files: RankFiles, stage: int, world_size: int, r: int) -> dict:
    """Rank ``r``'s file content for ``world_size`` ranks, read piece by piece from the old
    files."""
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
                return lambda rank: (files.zero(rank)["groups"][gi]["master"] if key is None
                                     else files.zero(rank)["groups"][gi]["state"][key])
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
    meta = read_meta(path)
    stage, old_world = int(meta.get("zero_stage") or 0), int(meta["world_size"])
    if stage not in (0, 1, 2, 3):
        raise CheckpointError(f"{path}: ZeRO stage {stage} is not a stage dslaunch writes")
    files = RankFiles(path, old_world)
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
    atomic_text(os.path.join(out_dir, "latest"), tag)
    return dst
