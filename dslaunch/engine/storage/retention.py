"""``keep_last``: after a checkpoint is published, delete the older ones, oldest first by the
order they were saved in, keeping the newest N and never the one ``latest`` names.

Only directories that are checkpoints of this format (a ``metadata.json`` with a
``dslaunch-`` format) are candidates: nothing else in the directory is touched. Save order is
``metadata.json``'s ``saved_at`` (its modification time for checkpoints written before that
field). A directory is first renamed to ``.<tag>.deleting`` and then removed, so a crash in the
middle never leaves a half-deleted directory that looks like a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil


def _saved_at(path: str):
    meta = os.path.join(path, "metadata.json")
    try:
        with open(meta) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    if not str(m.get("format", "")).startswith("dslaunch-"):
        return None
    return float(m.get("saved_at") or os.path.getmtime(meta))


def prune(save_dir: str, keep_last: int, latest_tag: str | None) -> list:
    """Delete all but the newest ``keep_last`` checkpoints of ``save_dir``; returns the tags
    deleted. ``keep_last`` 0: keep all."""
    if keep_last <= 0:
        return []
    tags = []
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        when = _saved_at(path)
        if when is not None:
            tags.append((when, name))
    tags.sort()
    doomed = [name for _, name in tags[:max(0, len(tags) - keep_last)] if name != latest_tag]
    for name in doomed:
        gone = os.path.join(save_dir, "." + name + ".deleting")
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(os.path.join(save_dir, name), gone)
        shutil.rmtree(gone, ignore_errors=True)
    return doomed
