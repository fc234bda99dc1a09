"""An AutoTP checkpoint loaded at another tensor-parallel size (``engine/parallel/autotp.py``).

The weights need nothing here: ``model_states.pt`` holds them whole (``save_load.py`` gathers
the slices on save and cuts this rank's on load), except at ZeRO 3, where they are in the shards:
``zero_to_fp32_script.autotp_checkpoint`` puts them back whole first. The optimizer state is per rank: at ZeRO stage
0 each rank's file holds the moments (and fp32 masters) of its own slices. The checkpoint's
``metadata.json`` names, under ``autotp``, the TP size, the parameters in the strategy's order
and, for each split one, its dim, whole size and every TP rank's rows; a job of another TP size
reads the files of the first TP group (global ranks ``0..tp-1``, data-parallel rank 0: stage 0
keeps the same state on every data rank), puts each split state tensor back together and cuts
its own rows.

At ZeRO 1-3 each TP rank's parameters are partitioned over its data-parallel group (global ranks
``d * tp + t``), flat. ``load_resplit_zero`` reads, for every parameter, each saved TP rank's
whole values out of its data ranks' shards (``ParamIndex``), puts the split ones back together,
cuts this rank's rows, lays them out as a one-rank checkpoint of this job's own layout and hands
that to the ZeRO resharder (``zero_shards.load_resharded_from``), which cuts this rank's shard.
A stage change across 0 and 1-3 together with a TP change is refused;
``load_optimizer_states=False`` loads the weights at any TP size.

Universal checkpoints (``universal.py``) hold every parameter whole: ``SavedTPRanks`` and
``whole_of`` put a TP checkpoint's slices together for ``dslaunch ckpt to-universal``
(``rank_slice`` cuts TP rank ``t``'s for its model-states file), and ``TPSlicedReader`` hands a
TP job's loader this rank's slices of the whole tensors.
"""

from __future__ import annotations

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.storage.files import CheckpointError, RankFiles, load_file, rank_file
from dslaunch.engine.storage.shard_index import ParamIndex, relayout
from dslaunch.engine.storage.zero_shards import HeldShards, load_resharded_from


def _layout(module) -> dict:
    return getattr(module, "ds_autotp_layout", None) or {"tp_size": 1, "ranges": [{}]}


def autotp_meta(engine) -> dict:
    """The ``autotp`` entry of the checkpoint's metadata ({} for a job without AutoTP)."""
    layout = getattr(engine.module, "ds_autotp_layout", None)
    if not layout:
        return {}
    named = list(engine.module.named_parameters())
    name_of = {id(p): n for n, p in named}
    splits = {n: {"dim": p.partition_dim, "full": p.tp_full,
                  "ranges": [r[n] for r in layout["ranges"]],
                  # GPT-2's Conv1D: held [out, in], the model's (and a universal file's) [in, out]
                  **({"conv1d": True} if getattr(p, "tp_conv1d", False) else {})}
              for n, p in named if getattr(p, "tensor_model_parallel", False)}
    params = getattr(engine.strategy, "params", None) or [p for _, p in named if p.requires_grad]
    return {"autotp": {"tp_size": layout["tp_size"], "splits": splits,
                       "param_names": [name_of.get(id(p), "") for p in params]}}


def tp_size_of(module) -> int:
    """The AutoTP size ``module`` was split at (1: not split)."""
    return int(_layout(module)["tp_size"])


def tp_size_changed(engine, meta: dict) -> bool:
    saved = (meta.get("autotp") or {}).get("tp_size", 1)
    return int(saved) != tp_size_of(engine.module)


def _whole(parts: list, split: dict) -> torch.Tensor:
    dim = split["dim"]
    shape = list(parts[0].shape)
    shape[dim] = split["full"]
    full = parts[0].new_empty(shape)
    for part, ranges in zip(parts, split["ranges"]):
        at = 0
        for start, stop in ranges:
            full.narrow(dim, start, stop - start).copy_(part.narrow(dim, at, stop - start))
            at += stop - start
    return full


def whole_of(parts: list, name: str, splits: dict) -> torch.Tensor:
    """Parameter ``name``'s whole tensor from each saved TP rank's part (a part of a parameter
    that is not split: every rank holds all of it, the first is taken)."""
    return _whole(parts, splits[name]) if name in splits else parts[0]


def rank_slice(full: torch.Tensor, split: dict, t: int) -> torch.Tensor:
    """TP rank ``t``'s slice of a whole tensor (``split``: the metadata's entry)."""
    idx = torch.cat([torch.arange(a, b) for a, b in split["ranges"][t]])
    return full.index_select(split["dim"], idx).contiguous()


def _mine(full: torch.Tensor, param) -> torch.Tensor:
    if not getattr(param, "tensor_model_parallel", False):
        return full
    idx = torch.cat([torch.arange(a, b) for a, b in param.tp_ranges])
    return full.index_select(param.partition_dim, idx).contiguous()


def _resplit(parts: list, name: str, splits: dict, param) -> torch.Tensor:
    """One state tensor of parameter ``name`` (one per saved TP rank) for this rank's ``param``."""
    mine = _mine(whole_of(parts, name, splits), param)
    if mine.shape != param.shape:
        raise CheckpointError(f"AutoTP checkpoint: the state of {name} has shape "
                              f"{tuple(mine.shape)} after re-splitting, the parameter "
                              f"{tuple(param.shape)}")
    return mine


def load_resplit_optimizer(engine, path: str, meta: dict) -> None:
    """This rank's optimizer state (and fp32 masters) from a checkpoint written at another TP
    size: stage 0 here, ZeRO 1-3 by ``load_resplit_zero``."""
    info = meta.get("autotp") or {"tp_size": 1, "splits": {}, "param_names": None}
    saved_tp, now_tp = int(info["tp_size"]), _layout(engine.module)["tp_size"]
    saved_stage = meta.get("zero_stage")
    if saved_stage in (1, 2, 3) and engine.zero_stage in (1, 2, 3):
        return load_resplit_zero(engine, path, meta)
    if saved_stage != 0 or engine.zero_stage != 0:
        raise CheckpointError(
            f"{path}: saved at tensor-parallel size {saved_tp}, this job has {now_tp}: the "
            f"optimizer state is re-split from stage 0 to 0 or among stages 1-3 (saved at "
            f"stage {saved_stage}, this job {engine.zero_stage}); load it at the stage it was "
            "saved with, or with load_optimizer_states=False (the weights load at any TP size)")
    strategy = engine.strategy
    named = dict(engine.module.named_parameters())
    name_of = {id(p): n for n, p in named.items()}
    names = [name_of.get(id(p), "") for p in strategy.params]
    if info["param_names"] is not None and info["param_names"] != names:
        raise CheckpointError(f"{path}: the checkpoint's parameters are not this model's "
                              "(names or order differ)")
    states = [load_file(rank_file(path, r))["strategy"] for r in range(saved_tp)]
    splits = info["splits"]
    opt = states[0]["optimizer"]
    new_state = {}
    for idx, st in opt["state"].items():
        name, param = names[int(idx)], strategy.params[int(idx)]
        new_state[idx] = {
            key: (_resplit([s["optimizer"]["state"][idx][key] for s in states], name, splits,
                           param)
                  if isinstance(val, torch.Tensor) and val.dim() > 0 else val)
            for key, val in st.items()}
    sd = {"optimizer": {"state": new_state, "param_groups": opt["param_groups"]}}
    if "fp32_masters" in states[0]:
        sd["fp32_masters"] = [
            _resplit([s["fp32_masters"][i] for s in states], names[i], splits, p)
            for i, p in enumerate(strategy.params)]
    try:
        strategy.load_state_dict(sd, load_optimizer_states=True)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: optimizer state does not fit ({e})") from None


# -- ZeRO 1-3 ---------------------------------------------------------------------------------

class SavedTPRanks:
    """The ZeRO 1-3 shards of a checkpoint saved at ``tp`` x ``dp``, read per TP rank: every
    parameter's whole (this TP rank's, unsplit by ZeRO) flat values of the masters or a state."""

    def __init__(self, path: str, meta: dict, tp: int):
        world = int(meta["world_size"])
        self.files, self.tp, self.dp = RankFiles(path, world), tp, world // tp
        self.where = []  # per TP rank: name -> (group index, ParamIndex)
        for t in range(tp):
            found = {}
            for gi, g in enumerate(self.files.zero(t)["groups"]):
                index = ParamIndex(P.Layout.from_meta(g["layout"]))
                found.update({n: (gi, index) for n in index.names()})
            self.where.append(found)

    def values(self, t: int, name: str, key) -> torch.Tensor:
        """TP rank ``t``'s values of ``name`` (``key`` None: the fp32 masters), its shape."""
        if name not in self.where[t]:
            raise CheckpointError(f"AutoTP checkpoint: parameter {name} is not in its ZeRO "
                                  "shards")
        gi, index = self.where[t][name]

        def shard(k):  # data rank k of TP rank t
            g = self.files.zero(k * self.tp + t)["groups"][gi]
            return g["master"] if key is None else g["state"][key]
        return index.gather(shard, name).reshape(index.where[name][1].shape)

    def group_of(self, name: str) -> dict:
        gi, _ = self.where[0][name]
        return self.files.zero(0)["groups"][gi]


def load_resplit_zero(engine, path: str, meta: dict) -> None:
    """This rank's ZeRO 1-3 shard of the fp32 masters and optimizer states from a ZeRO 1-3
    checkpoint written at another TP size."""
    info = meta.get("autotp") or {"tp_size": 1, "splits": {}}
    saved = SavedTPRanks(path, meta, int(info["tp_size"]))
    splits, strategy = info["splits"], engine.strategy
    params = dict(engine.module.named_parameters())

    def mine(name, key):
        parts = [saved.values(t, name, key) for t in range(saved.tp)]
        return _resplit(parts, name, splits, params[name]).reshape(-1)

    groups = []
    for g in strategy.groups:
        whole = relayout(g.layout, 1)  # this job's buckets as one rank holds them
        offsets = whole.shard_offsets()
        slots = [(bi, s) for bi, b in enumerate(whole.buckets) for s in b.slots]
        first = saved.group_of(slots[0][1].name)
        keys = list(first["state"])

        def flat(key, whole=whole, offsets=offsets, slots=slots):
            out = torch.zeros(whole.shard_numel, dtype=torch.float32)
            for bi, s in slots:
                out[offsets[bi] + s.start: offsets[bi] + s.start + s.numel] = mine(s.name, key)
            return out
        groups.append({"layout": whole.meta(), "master": flat(None),
                       "state": {k: flat(k) for k in keys}, "scalars": first["scalars"]})
    one = {"zero": {"stage": meta.get("zero_stage"), "world_size": 1, "rank": 0,
                    "groups": groups},
           "param_groups": saved.files.raw(0)["strategy"].get("param_groups", [])}
    try:
        load_resharded_from(strategy, HeldShards({0: one}), 1)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: cannot re-split the ZeRO optimizer state ({e})") from None


# -- universal checkpoints (whole tensors) into a TP job ------------------------------------------

def whole_shapes(module) -> dict:
    """Every parameter's whole shape (the model's own layout) under AutoTP."""
    out = {}
    for n, p in module.named_parameters():
        shape = list(p.shape)
        if getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_full"):
            shape[p.partition_dim] = p.tp_full
            if getattr(p, "tp_conv1d", False):
                shape.reverse()
        out[n] = tuple(shape)
    return out


class TPSlicedReader:
    """A universal checkpoint's reader (``universal.UniversalCheckpoint``: whole tensors) seen
    by a tensor-parallel job: the same interface, with this rank's slice of every split
    parameter (shape, weights, optimizer states), so ``deepspeed_format.load_deepspeed_checkpoint``
    and the stage 0 loader cut their shards out of it as from an unsplit checkpoint."""

    def __init__(self, reader, module):
        from dslaunch.engine.parallel.autotp import slice_tp_state

        self._reader, self._module, self._slice = reader, module, slice_tp_state
        self.params = {n: p for n, p in module.named_parameters()
                       if getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_ranges")}
        self.shape = dict(reader.shape)
        for n, p in self.params.items():
            if n in self.shape:
                self.shape[n] = tuple(p.shape)
        self._last = (None, None)

    def __getattr__(self, attr):  # where, path, model, model_path, scalars, param_groups, ...
        return getattr(self._reader, attr)

    def _local(self, key, name: str) -> torch.Tensor:
        if self._last[0] != (key, name):
            full = self._reader.gather(key, name).view(self._reader.shape[name])
            if getattr(self.params[name], "tp_conv1d", False):  # the model's [in, out] layout
                full = full.t()
            self._last = ((key, name), _mine(full, self.params[name]).reshape(-1))
        return self._last[1]

    def gather(self, key, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        if name not in self.params:
            return self._reader.gather(key, name, lo, hi)
        flat = self._local(key, name)
        return flat[lo:flat.numel() if hi is None else hi]

    def full(self, name: str) -> torch.Tensor:
        return self.gather(None, name).view(self.shape[name])

    def module_state_dict(self) -> dict:
        return self._slice(self._reader.module_state_dict(), self._module)
