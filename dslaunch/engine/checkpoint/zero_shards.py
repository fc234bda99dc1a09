"""What a ZeRO 1-3 rank saves and loads: its shard of the fp32 weights and of every optimizer
state, plus the layout metadata that says which parameter elements the shard holds (so that
consolidation and reshaping to another world size need nothing but the files).

Per rank, under ``strategy`` in ``rank_{r}_optim_states.pt``::

    {"zero": {"stage", "world_size", "rank", "dtype",
              "groups": [{"layout": Layout.meta(), "master": fp32 shard,
                          "state": {"exp_avg": shard, ...}, "scalars": {"step": tensor}}]},
     "param_groups": [{hyperparameters of each optimizer group}]}
"""

from __future__ import annotations

import contextvars
import json
import os

import torch

from dslaunch.engine.zero import partition as P

from .files import RankFiles
from .shard_index import ParamIndex, reshard

# An async save (async_save.py) hands its reusable host buffers here: ``alloc(numel, dtype)``
STAGING: contextvars.ContextVar = contextvars.ContextVar("dslaunch_ckpt_staging", default=None)


def _flat(parts: list) -> torch.Tensor:
    """``parts`` concatenated into a new host tensor (a reused staging buffer when an async save
    set one and the parts are on the host: no fresh pages to fault in)."""
    alloc = STAGING.get()
    if alloc is None or parts[0].device.type != "cpu" or len({p.dtype for p in parts}) > 1:
        return torch.cat(parts).cpu()
    out = alloc(sum(p.numel() for p in parts), parts[0].dtype)
    if len(parts) == 1:
        return out.view(parts[0].shape).copy_(parts[0])
    return torch.cat(parts, out=out.view(-1, *parts[0].shape[1:]))


def _shard_values(strategy, g) -> torch.Tensor:
    if g.master is not None:
        return _flat([g.master.detach()])
    return _flat([c.detach().float() for c in g.chunks])


def shard_state_dict(strategy) -> dict:
    groups = []
    for g in strategy.groups:
        state: dict = {}
        scalars: dict = {}
        per_chunk = [strategy.optimizer.state.get(sp, {}) for sp in g.shard_params]
        keys = sorted({k for st in per_chunk for k in st})
        for k in keys:
            vals = [st.get(k) for st in per_chunk]
            if all(torch.is_tensor(v) and v.numel() == sp.numel() and v.dim() > 0
                   for v, sp in zip(vals, g.shard_params)):
                state[k] = _flat([v.detach().reshape(-1) for v in vals])
            else:
                v = next(v for v in vals if v is not None)
                scalars[k] = v.detach().clone().cpu() if torch.is_tensor(v) else torch.tensor(v)
        groups.append({"layout": g.layout.meta(), "master": _shard_values(strategy, g),
                       "state": state, "scalars": scalars})
    hyper = [{k: v for k, v in pg.items() if k != "params"}
             for pg in strategy.optimizer.param_groups]
    return {"zero": {"stage": strategy.stage, "world_size": strategy.world, "rank": strategy.rank,
                     "dtype": str(strategy.dtype).replace("torch.", ""), "groups": groups},
            "param_groups": hyper}


def _check_layout(saved: dict, g, gi: int) -> None:
    mine = g.layout.meta()
    if saved == mine:
        return
    a = [p for b in saved["buckets"] for p in b["params"]]
    b = [p for bk in mine["buckets"] for p in bk["params"]]
    for x, y in zip(a, b):
        if x[0] != y[0] or x[1] != y[1]:
            raise ValueError(f"group {gi}: checkpoint tensor {x[0]!r} {x[1]} does not match the "
                             f"model's {y[0]!r} {y[1]}")
    if len(a) != len(b):
        name = (a if len(a) > len(b) else b)[min(len(a), len(b))][0]
        raise ValueError(f"group {gi}: tensor {name!r} is only in the "
                         f"{'checkpoint' if len(a) > len(b) else 'model'}")
    raise ValueError(f"group {gi}: saved with another bucket layout (world size "
                     f"{saved['world_size']}, this job {mine['world_size']}); reshape it with "
                     "`dslaunch ckpt reshape` or keep the same reduce_bucket_size")


def load_shard_state_dict(strategy, sd: dict) -> None:
    z = sd.get("zero") if isinstance(sd, dict) else None
    if z is None:
        raise ValueError("not a ZeRO 1-3 shard (saved by stage 0?)")
    if len(z["groups"]) != len(strategy.groups):
        raise ValueError(f"{len(z['groups'])} optimizer groups saved, {len(strategy.groups)} now")
    for gi, (saved, g) in enumerate(zip(z["groups"], strategy.groups)):
        _check_layout(saved["layout"], g, gi)
        load_group(strategy, g, saved["master"], saved["state"], saved["scalars"])
    for pg, hyper in zip(strategy.optimizer.param_groups, sd.get("param_groups", [])):
        pg.update(hyper)
    strategy._all_gather_params()


def load_group(strategy, g, master: torch.Tensor, state: dict, scalars: dict,
               own: bool = False) -> None:
    """Put one group's shard values (fp32 weights, optimizer states) in place. ``own``: the state
    tensors were built for this call (resharded), so the optimizer keeps views of them instead of
    copies (the rank file's tensors are copied: they may be views of a mapped file)."""
    with torch.no_grad():
        if g.master is not None:
            g.master.copy_(master)
        for c, m in zip(g.chunks, P.shard_chunks(master, g.layout)):
            c.copy_(m)
        opt_state = strategy.optimizer.state
        pieces = {k: P.shard_chunks(full, g.layout) for k, full in state.items()}
        for sp_i, sp in enumerate(g.shard_params):
            st = {}
            for k, full in state.items():
                piece = pieces[k][sp_i].to(sp.device)
                st[k] = piece if own or piece.device != full.device else piece.clone()
            for k, v in scalars.items():
                st[k] = _scalar_state(strategy.optimizer, k, v, sp.device)
            opt_state[sp] = st


def _scalar_state(optimizer, key: str, v: torch.Tensor, device: torch.device):
    """A saved scalar in the form ``optimizer`` keeps it. The step count is a Python int in the
    compiled CPU optimizers (offload_optimizer) and a 0-dim float32 tensor in torch's: a
    checkpoint saved with offload can be loaded without it, and the other way round. Torch's
    fused and capturable kernels want that tensor on the parameters' device (a GPU), the others
    on the CPU (torch's own ``load_state_dict`` policy)."""
    from dslaunch.engine.optim.cpu_adam import _CPUOptimizer

    while hasattr(optimizer, "inner"):  # the NVMe swapper steps the optimizer it wraps
        optimizer = optimizer.inner
    if key == "step" and v.dim() == 0:
        if isinstance(optimizer, _CPUOptimizer):
            return int(v)
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        return v.to(dtype=torch.float32, device=device if on_device else "cpu").clone()
    # other integer counts go back as Python ints, as they were saved
    return int(v) if not v.is_floating_point() and v.dim() == 0 else v.clone()


def load_resharded(strategy, ckpt_path: str) -> None:
    """Load a ZeRO 1-3 checkpoint laid out otherwise (another world size, stage or bucket size;
    shards are matched by parameter name): every rank reads the pieces of the old shards that
    fall in its new shard (files opened with mmap): memory of the order of its own shard."""
    with open(os.path.join(ckpt_path, "metadata.json")) as f:
        meta = json.load(f)
    files = RankFiles(ckpt_path, int(meta["world_size"]))
    z0 = files.zero(0)
    if z0 is None:
        raise ValueError("the checkpoint holds no ZeRO 1-3 shards (saved by stage 0?)")
    if len(z0["groups"]) != len(strategy.groups):
        raise ValueError(f"{len(z0['groups'])} optimizer groups saved, {len(strategy.groups)} now")
    for gi, (saved, g) in enumerate(zip(z0["groups"], strategy.groups)):
        old = ParamIndex(P.Layout.from_meta(saved["layout"]))
        for _, s, *_ in g.layout.shard_pieces(strategy.rank):
            if s.name not in old.where:
                raise ValueError(f"model tensor {s.name!r} is not in the checkpoint")
            if tuple(old.where[s.name][1].shape) != tuple(s.shape):
                raise ValueError(f"tensor {s.name!r} is {list(old.where[s.name][1].shape)} in the "
                                 f"checkpoint but {list(s.shape)} in the model")

        def src(key, gi=gi):
            return lambda rank: (files.zero(rank)["groups"][gi]["master"] if key is None
                                 else files.zero(rank)["groups"][gi]["state"][key])
        master = reshard(g.layout, strategy.rank, old, src(None))
        state = {k: reshard(g.layout, strategy.rank, old, src(k), v.dtype)
                 for k, v in saved["state"].items()}
        load_group(strategy, g, master, state, saved["scalars"], own=True)
    for pg, hyper in zip(strategy.optimizer.param_groups,
                         files.raw(0)["strategy"].get("param_groups", [])):
        pg.update(hyper)
    strategy._all_gather_params()
