"""An AutoTP checkpoint loaded at another tensor-parallel size (``engine/autotp.py``).

The weights need nothing here: ``model_states.pt`` holds them whole (``save_load.py`` gathers
the slices on save and cuts this rank's on load). The optimizer state is per rank: at ZeRO stage
0 each rank's file holds the moments (and fp32 masters) of its own slices. The checkpoint's
``metadata.json`` names, under ``autotp``, the TP size, the parameters in the strategy's order
and, for each split one, its dim, whole size and every TP rank's rows; a job of another TP size
reads the files of the first TP group (global ranks ``0..tp-1``, data-parallel rank 0: stage 0
keeps the same state on every data rank), puts each split state tensor back together and cuts
its own rows. ZeRO 1-2 shards (flat partitions over the data ranks) are not re-split: that is a
clear error, and ``load_optimizer_states=False`` loads the weights.
"""

from __future__ import annotations

import torch

from .files import CheckpointError, load_file, rank_file


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
                  "ranges": [r[n] for r in layout["ranges"]]}
              for n, p in named if getattr(p, "tensor_model_parallel", False)}
    params = getattr(engine.strategy, "params", None) or [p for _, p in named if p.requires_grad]
    return {"autotp": {"tp_size": layout["tp_size"], "splits": splits,
                       "param_names": [name_of.get(id(p), "") for p in params]}}


def tp_size_changed(engine, meta: dict) -> bool:
    saved = (meta.get("autotp") or {}).get("tp_size", 1)
    return int(saved) != int(_layout(engine.module)["tp_size"])


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


def _mine(full: torch.Tensor, param) -> torch.Tensor:
    if not getattr(param, "tensor_model_parallel", False):
        return full
    idx = torch.cat([torch.arange(a, b) for a, b in param.tp_ranges])
    return full.index_select(param.partition_dim, idx).contiguous()


def _resplit(parts: list, name: str, splits: dict, param) -> torch.Tensor:
    """One state tensor of parameter ``name`` (one per saved TP rank) for this rank's ``param``."""
    full = _whole(parts, splits[name]) if name in splits else parts[0]
    mine = _mine(full, param)
    if mine.shape != param.shape:
        raise CheckpointError(f"AutoTP checkpoint: the state of {name} has shape "
                              f"{tuple(mine.shape)} after re-splitting, the parameter "
                              f"{tuple(param.shape)}")
    return mine


def load_resplit_optimizer(engine, path: str, meta: dict) -> None:
    """This rank's stage-0 optimizer state (and fp32 masters) from a checkpoint written at
    another TP size."""
    info = meta.get("autotp") or {"tp_size": 1, "splits": {}, "param_names": None}
    saved_tp, now_tp = int(info["tp_size"]), _layout(engine.module)["tp_size"]
    if meta.get("zero_stage") != 0 or engine.zero_stage != 0:
        raise CheckpointError(
            f"{path}: saved at tensor-parallel size {saved_tp}, this job has {now_tp}: the "
            f"optimizer state is re-split at ZeRO stage 0 only (saved at stage "
            f"{meta.get('zero_stage')}, this job {engine.zero_stage}); load with "
            "load_optimizer_states=False (the weights load at any TP size)")
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
