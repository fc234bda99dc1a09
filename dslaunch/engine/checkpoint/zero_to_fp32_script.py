#!/usr/bin/env python
"""Consolidate the dslaunch checkpoints of this folder into one fp32 state_dict, with torch alone.

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT [--tag TAG] [--exclude_frozen_parameters]

CHECKPOINT_DIR is the folder holding ``latest`` (where this script was written); OUTPUT a file,
or an existing directory (``pytorch_model.bin`` is written in it). The result loads with
``torch.load(OUTPUT, weights_only=True)`` and ``model.load_state_dict``; ``dslaunch ckpt to-fp32``
gives the same. dslaunch's ``save_checkpoint`` writes this file beside its checkpoints (as
DeepSpeed does its own ``zero_to_fp32.py``) so that the weights can be recovered where dslaunch is
not installed: it imports nothing of dslaunch. Its source is dslaunch's
``engine/checkpoint/zero_to_fp32_script.py``.

Formats: ZeRO 0-3 (``model_states.pt``; for ZeRO 1-3 the fp32 masters are put back together from
the ranks' shards in ``rank_{r}_optim_states.pt``) and pipeline / tensor parallel
(``layer_stage{S}_tp{T}_model_states.pt``; tensor-parallel slices merged, fp32 masters in
bf16/fp16).
"""

import argparse
import json
import os
import sys

import torch

WRITTEN_BY = "dslaunch (template)"  # the writer puts dslaunch's version here


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def fp32(t):
    return t.to(torch.float32).clone() if t.is_floating_point() else t.clone()


class Masters:
    """ZeRO 1-3 fp32 master shards of one data-parallel group; ``rank_of(k)``: the global rank
    of data-parallel rank k. A rank's shard is its chunk of every bucket, concatenated; rank k
    owns elements [k*c, (k+1)*c) of a bucket of c*world elements."""

    def __init__(self, path, rank_of):
        self.path, self.rank_of, self.files, self.where = path, rank_of, {}, {}
        for gi, group in enumerate(self.zero(0)["groups"]):
            layout, pos = group["layout"], 0
            for bucket in layout["buckets"]:
                c = bucket["numel"] // layout["world_size"]
                for name, shape, start, numel in bucket["params"]:
                    self.where[name] = (gi, pos, c, start, numel, shape)
                pos += c

    def zero(self, k):
        rank = self.rank_of(k)
        if rank not in self.files:
            self.files[rank] = load(os.path.join(self.path, f"rank_{rank}_optim_states.pt"))
        return self.files[rank]["strategy"]["zero"]

    def get(self, name):
        if name not in self.where:
            return None
        gi, pos, c, start, numel, shape = self.where[name]
        parts = []
        for k in range(start // c, (start + numel - 1) // c + 1):
            lo, hi = max(start, k * c), min(start + numel, (k + 1) * c)
            parts.append(self.zero(k)["groups"][gi]["master"][pos + lo - k * c: pos + hi - k * c])
        return torch.cat(parts).to(torch.float32).reshape(shape)  # cat copies


def zero_checkpoint(path, meta):
    module = load(os.path.join(path, "model_states.pt"))["module"]
    masters = Masters(path, lambda k: k) if meta.get("zero_stage") in (1, 2, 3) else None
    out = {}
    for name, saved in module.items():
        master = masters.get(name) if masters else None
        out[name] = fp32(saved) if master is None else master
    return out


def stage_masters(path, meta, global_rank):
    """name -> fp32 master (or None) of one (pipeline stage, TP rank)."""
    if meta.get("dtype", "fp32") == "fp32":
        return lambda name: None  # the layer files hold the exact fp32 weights
    if not meta.get("zero_stage"):
        strategy = load(os.path.join(path, f"rank_{global_rank(0)}_optim_states.pt"))["strategy"]
        return dict(zip(meta["param_names"], strategy.get("fp32_masters") or [])).get
    return Masters(path, global_rank).get


def rank_of(stage, tp_rank, dp, tp):
    """Data-parallel rank -> global rank at one (stage, TP rank): pipe slowest, model fastest."""
    return lambda d: (stage * dp + d) * tp + tp_rank


def unsplit(pieces, splits):
    """A tensor-parallel parameter from its TP ranks' slices and the row ranges each holds."""
    dim = splits[0]["dim"]
    shape = list(pieces[0].shape)
    shape[dim] = splits[0]["full"]
    out = torch.empty(shape, dtype=pieces[0].dtype)
    for piece, split in zip(pieces, splits):
        pos = 0
        for a, b in split["ranges"]:
            out.narrow(dim, a, b - a).copy_(piece.narrow(dim, pos, b - a))
            pos += b - a
    return out


def pipe_checkpoint(path, meta):
    pipe, tp, dp = meta["pipe"], meta["tp"], meta["dp"]
    out = {}
    for s in range(pipe):
        layers, masters, splits = [], [], []
        for t in range(tp):
            name = f"layer_stage{s:02d}_tp{t:02d}_model_states.pt"
            layers.append(load(os.path.join(path, name)))
            shard = meta.get("shards", {}).get(f"{s}_{t}", {})
            masters.append(stage_masters(path, dict(meta, **shard), rank_of(s, t, dp, tp)))
            splits.append(shard.get("splits", {}))
        for name in layers[0]:
            if name in out:
                continue  # a tied layer on several stages: its first owner's copy
            values = []
            for t in range(tp if name in splits[0] else 1):
                master, saved = masters[t](name), layers[t][name]
                values.append(fp32(saved if master is None else master.reshape(saved.shape)))
            out[name] = unsplit(values, [sp[name] for sp in splits]) if len(values) > 1 \
                else values[0]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=f"written by {WRITTEN_BY}")
    p.add_argument("checkpoint_dir")
    p.add_argument("output", help="output file, or an existing directory")
    p.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: 'latest')")
    p.add_argument("--exclude_frozen_parameters", action="store_true")
    args = p.parse_args(argv)
    try:
        tag = args.tag
        if tag is None:
            with open(os.path.join(args.checkpoint_dir, "latest")) as f:
                tag = f.read().strip()
        path = os.path.join(args.checkpoint_dir, tag)
        with open(os.path.join(path, "metadata.json")) as f:
            meta = json.load(f)
        pipe = meta.get("format") == "dslaunch-pipe-1"
        state = pipe_checkpoint(path, meta) if pipe else zero_checkpoint(path, meta)
        if args.exclude_frozen_parameters:
            frozen = set(meta.get("frozen_params", []))
            for shard in meta.get("shards", {}).values():
                frozen.update(shard.get("frozen_params", []))
            state = {k: v for k, v in state.items() if k not in frozen}
        out = args.output
        if os.path.isdir(out):
            out = os.path.join(out, "pytorch_model.bin")
        torch.save(state, out + ".part")
        os.replace(out + ".part", out)
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        sys.exit(f"zero_to_fp32.py: cannot consolidate {args.checkpoint_dir}: "
                 f"{type(e).__name__}: {e}")
    print(f"wrote {out}: {len(state)} tensors (fp32) from {path}")


if __name__ == "__main__":
    main()
