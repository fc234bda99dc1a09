"""What a ZeRO 1-3 rank saves and loads: its shard of the fp32 weights and of every optimizer
state, plus the layout metadata that says which parameter elements the shard holds (so that
consolidation and reshaping to another world size need nothing but the files).

Per rank, under ``strategy`` in ``rank_{r}_optim_states.pt``::

    {"zero": {"stage", "world_size", "rank", "dtype",
              "groups": [{"layout": Layout.meta(), "master": fp32 shard,
                          "state": {"exp_avg": shard, ...}, "scalars": {"step": tensor}}]},
     "param_groups": [{hyperparameters of each optimizer group}]}

MoE (``engine/parallel/experts.py``): an expert group is partitioned over its expert-data-parallel group,
not the data-parallel one; its layout names experts by global id, and the group also records
``rank`` (within that group) and ``ranks`` (the group's global ranks, in order), so a load at
another ``ep_size`` finds each expert in the files of whichever ranks held it.
"""

from __future__ import annotations

import contextvars
import json
import os

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.storage.files import RankFiles
from dslaunch.engine.storage.shard_index import ParamIndex

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


def global_names(strategy) -> dict:
    """{local name: checkpoint name} of the MoE expert parameters (empty without experts)."""
    experts = getattr(strategy, "experts", None)
    if not experts:
        return {}
    return {local: name for local, (name, _, _) in experts.global_names(strategy.model).items()}


def saved_meta(g, names: dict) -> dict:
    """The group's layout metadata as a checkpoint holds it (experts under their global names)."""
    meta = g.layout.meta()
    if names:
        for b in meta["buckets"]:
            for p in b["params"]:
                p[0] = names.get(p[0], p[0])
    return meta


def _group_ranks(g) -> list:
    import torch.distributed as dist

    group = getattr(g.comm, "group", None)
    if group is None or not dist.is_initialized():
        return list(range(g.world))
    return list(dist.get_process_group_ranks(group))


def shard_state_dict(strategy) -> dict:
    groups = []
    names = global_names(strategy)
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
        groups.append({"layout": saved_meta(g, names), "master": _shard_values(strategy, g),
                       "state": state, "scalars": scalars})
        if names:
            groups[-1].update(rank=g.rank, ranks=_group_ranks(g))
    hyper = [{k: v for k, v in pg.items() if k != "params"}
             for pg in strategy.optimizer.param_groups]
    return {"zero": {"stage": strategy.stage, "world_size": strategy.world, "rank": strategy.rank,
                     "dtype": str(strategy.dtype).replace("torch.", ""), "groups": groups},
            "param_groups": hyper}


def _check_layout(saved: dict, g, gi: int, names: dict) -> None:
    mine = saved_meta(g, names)
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
    names = global_names(strategy)
    for gi, (saved, g) in enumerate(zip(z["groups"], strategy.groups)):
        _check_layout(saved["layout"], g, gi, names)
        load_group(strategy, g, saved["master"], saved["state"], saved["scalars"])
    _load_hyper(strategy, sd.get("param_groups", []))


def _load_hyper(strategy, saved: list, gather: bool = True) -> None:
    """The saved optimizer hyperparameters (an MoE group keeps its own group name: the ep size
    may have changed); then every rank's updated chunks are all-gathered (``gather``)."""
    for pg, hyper in zip(strategy.optimizer.param_groups, saved):
        pg.update({k: v for k, v in hyper.items() if k not in ("moe", "name")})
    if gather:
        strategy._all_gather_params()


def load_group(strategy, g, master: torch.Tensor, state: dict, scalars: dict,
               own: bool = False) -> None:
    """Put one group's shard values (fp32 weights, optimizer states) in place. ``own``: the state
    tensors were built for this call (resharded), so the optimizer keeps views of them instead of
    copies (the rank file's tensors are copied: they may be views of a mapped file)."""
    put_master(g, master)
    with torch.no_grad():
        opt_state = strategy.optimizer.state
        pieces = {k: P.shard_chunks(full, g.layout) for k, full in state.items()}
        for sp_i, sp in enumerate(g.shard_params):
            st = {}
            for k, full in state.items():
                piece = pieces[k][sp_i].to(sp.device)
                st[k] = piece if own or piece.device != full.device else piece.clone()
            for k, v in scalars.items():
                st[k] = scalar_state(strategy.optimizer, k, v, sp.device)
            opt_state[sp] = st


def put_master(g, master: torch.Tensor) -> None:
    """Set group ``g``'s shard values: its fp32 masters (when kept) and parameter chunks."""
    with torch.no_grad():
        if g.master is not None:
            g.master.copy_(master)
        for c, m in zip(g.chunks, P.shard_chunks(master, g.layout)):
            c.copy_(m)


def scalar_state(optimizer, key: str, v: torch.Tensor, device: torch.device):
    """A saved scalar in the form ``optimizer`` keeps it. The step count is a Python int in the
    compiled CPU optimizers (offload_optimizer) and a 0-dim float32 tensor in torch's: a
    checkpoint saved with offload can be loaded without it, and the other way round. Torch's
    fused and capturable kernels want that tensor on the parameters' device (a GPU), the others
    on the CPU (torch's own ``load_state_dict`` policy)."""
    from dslaunch.engine.optim.cpu_adam import CPUOptimizer

    while hasattr(optimizer, "inner"):  # the NVMe swapper steps the optimizer it wraps
        optimizer = optimizer.inner
    if key == "step" and v.dim() == 0:
        if isinstance(optimizer, CPUOptimizer):
            return int(v)
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        return v.to(dtype=torch.float32, device=device if on_device else "cpu").clone()
    # other integer counts go back as Python ints, as they were saved
    return int(v) if not v.is_floating_point() and v.dim() == 0 else v.clone()


def old_index(files: RankFiles, gi: int, world: int, members: tuple | None = None) -> dict:
    """name -> (ParamIndex, global rank holding each shard) for the checkpoint's optimizer group
    ``gi``: one layout for a group partitioned over the data-parallel ranks ``members`` (the
    old global ranks whose shards this rank's state comes from: ``data_ranks``, default all
    ``world``), one per expert-data-parallel group for MoE experts (each of those ranks' files
    holds its own)."""
    members = tuple(range(world)) if members is None else members
    where, seen = {}, set()
    for r in members:
        saved = files.zero(r)["groups"][gi]
        ranks = tuple(saved.get("ranks", members))
        if ranks not in seen:
            seen.add(ranks)
            index = ParamIndex(P.Layout.from_meta(saved["layout"]))
            for name in index.names():
                where[name] = (index, ranks)
        if len(ranks) == len(members):  # every rank's layout is this one
            break
    return where


def data_ranks(meta: dict, world: int) -> tuple:
    """The old global ranks whose shards make this rank's: all of them, but under AutoTP only
    those of this rank's TP rank (each TP rank's slices, under the same names, were partitioned
    over its own data ranks: ranks r..r+N-1 share one model, so TP rank = rank % N; this job has
    the same TP size, ``tp_size_changed`` takes the other case)."""
    tp = int((meta.get("autotp") or {}).get("tp_size", 1))
    if tp <= 1:
        return tuple(range(world))
    import torch.distributed as dist

    return tuple(range(dist.get_rank() % tp, world, tp))


def reshard_group(g, where: dict, names: dict, shard_of, dtype=torch.float32) -> torch.Tensor:
    """This rank's shard of group ``g``, filled by parameter from the checkpoint's shards
    (``shard_of(global rank)``: that rank's tensor of this group)."""
    out = torch.zeros(g.layout.shard_numel, dtype=dtype)
    for _, s, lo, hi, pos in g.layout.shard_pieces(g.rank):
        name = names.get(s.name, s.name)
        index, ranks = where[name]
        out[pos: pos + hi - lo].copy_(
            index.gather(lambda k, ranks=ranks: shard_of(ranks[k]), name, lo, hi))
    return out


def load_resharded(strategy, ckpt_path: str) -> None:
    """Load a ZeRO 1-3 checkpoint laid out otherwise (another world size, stage, bucket size or
    MoE ``ep_size``; shards are matched by parameter name, experts by global id): every rank
    reads the pieces of the old shards that fall in its new shard (files opened with mmap):
    memory of the order of its own shard."""
    with open(os.path.join(ckpt_path, "metadata.json")) as f:
        meta = json.load(f)
    world = int(meta["world_size"])
    load_resharded_from(strategy, RankFiles(ckpt_path, world), world,
                        members=data_ranks(meta, world))


class HeldShards:
    """Shard state dicts held in memory ({old rank: ``shard_state_dict``}), read as the rank
    files of a checkpoint are (in-process recovery: the survivors' shards and their copies)."""

    def __init__(self, shards: dict):
        self.shards = shards

    def zero(self, rank: int) -> dict:
        return self.shards[rank]["zero"]

    def raw(self, rank: int) -> dict:
        return {"strategy": self.shards[rank]}


def load_resharded_from(strategy, files, world: int, gather: bool = True,
                        members: tuple | None = None) -> None:
    """``load_resharded`` from ``files`` (``RankFiles`` or ``HeldShards``) of a ``world``-rank
    layout; ``gather=False`` leaves the all-gather of the updated chunks to the caller;
    ``members``: the old ranks this rank's shard comes from (``data_ranks``; default all)."""
    members = tuple(range(world)) if members is None else members
    z0 = files.zero(members[0])
    if z0 is None:
        raise ValueError("the checkpoint holds no ZeRO 1-3 shards (saved by stage 0?)")
    if len(z0["groups"]) != len(strategy.groups):
        raise ValueError(f"{len(z0['groups'])} optimizer groups saved, {len(strategy.groups)} now")
    names = global_names(strategy)
    for gi, (saved, g) in enumerate(zip(z0["groups"], strategy.groups)):
        where = old_index(files, gi, world, members)
        for _, s, *_ in g.layout.shard_pieces(g.rank):
            name = names.get(s.name, s.name)
            if name not in where:
                raise ValueError(f"model tensor {name!r} is not in the checkpoint")
            old_shape = tuple(where[name][0].where[name][1].shape)
            if old_shape != tuple(s.shape):
                raise ValueError(f"tensor {name!r} is {list(old_shape)} in the checkpoint but "
                                 f"{list(s.shape)} in the model")

        def src(key, gi=gi):
            return lambda rank: (files.zero(rank)["groups"][gi]["master"] if key is None
                                 else files.zero(rank)["groups"][gi]["state"][key])
        master = reshard_group(g, where, names, src(None))
        state = {k: reshard_group(g, where, names, src(k), v.dtype) for k, v in saved["state"].items()}
        load_group(strategy, g, master, state, saved["scalars"], own=True)
    _load_hyper(strategy, files.raw(0)["strategy"].get("param_groups", []), gather=gather)
