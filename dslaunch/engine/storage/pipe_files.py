"""The files of a pipeline engine's checkpoint: its format tag and one module file per (stage,
TP rank) (``pipeline.py`` writes and reads them; consolidation and universal checkpoints read
them too)."""

from __future__ import annotations

import os

from dslaunch.engine.storage.files import read_meta, resolve_tag

FORMAT = "dslaunch-pipe-1"


def layer_file(d, stage, tp):
    return os.path.join(d, f"layer_stage{stage:02d}_tp{tp:02d}_model_states.pt")


def is_pipe_checkpoint(ckpt_dir: str, tag=None) -> bool:
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    return read_meta(os.path.join(ckpt_dir, tag)).get("format") == FORMAT
