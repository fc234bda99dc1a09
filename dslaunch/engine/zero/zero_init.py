"""DeepSpeed's ``deepspeed.zero.Init`` and ``GatheredParameters`` (public as ``dslaunch.zero``).

``Init(config_dict_or_path=cfg)`` partitions parameters at construction when the config says ZeRO
stage 3 (the config may also come from ``config=`` or, inside ``dslaunch run --config``, from the
launcher); under other stages it builds the model normally. While the context is active:

- every ``nn.Module`` subclass's ``__init__`` is wrapped: when a module's outermost ``__init__``
  returns, each of its parameters not yet partitioned is broadcast from rank 0 (so every rank
  holds rank 0's values whatever its RNG state), this rank keeps its chunk (elements
  [r·c, (r+1)·c) of the flattened parameter padded to c·N, kept as ``param._dsl_shard``) and the
  parameter's storage is freed (its shape stays). So at most one module's own parameters are
  whole on a rank at a time; children are partitioned before their parent finishes;
- ``nn.Module.apply(fn)`` (the usual ``self.apply(self._init_weights)`` at the end of a model's
  ``__init__``) runs ``fn`` on each module with that module's own parameters gathered, rank 0's
  result broadcast, then re-partitioned.

Parameters built this way carry DeepSpeed's ``ds_*`` attributes (``param_status.py``) and must
not be read outside a gathered context before ``dslaunch.initialize`` (stage 3), which regroups
them unit by unit without materialising the model.

A forward that reads a parameter owned by another module (a tied head, say) declares it with
``register_external_parameter(module, param)`` so stage 3 gathers it around that module too.

``GatheredParameters(params, modifier_rank=None)`` (collective: every rank enters it) makes
partitioned parameters whole inside the block: a stage-3 strategy's buckets, or zero.Init's
per-parameter shards. With ``modifier_rank=r`` the values rank r holds when the block ends are
broadcast, written back into the shards and the fp32 masters, so a modification survives the next
optimizer step. For stages 0-2 (whole parameters) the block broadcasts rank r's values and
refreshes the masters of the strategy that owns them.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch
import torch.distributed as dist

from dslaunch.engine.comm import collectives as comm
from dslaunch.engine.zero.param_status import ZeroParamStatus, set_ds_attributes

LIVE_STRATEGIES: "weakref.WeakSet" = weakref.WeakSet()


def register_strategy(strategy) -> None:
    """Every ZeRO strategy (stages 0-3) registers here: GatheredParameters gathers their
    partitioned parameters and refreshes their masters, and ``param_access.py``
    (``dslaunch.utils.safe_get_full_*``) finds the strategy that owns a parameter."""
    LIVE_STRATEGIES.add(strategy)


def unregister_strategy(strategy) -> None:
    """``engine.destroy()``: GatheredParameters no longer looks at this strategy."""
    LIVE_STRATEGIES.discard(strategy)


# -- zero.Init's per-parameter partitioning -------------------------------------------------------

def _world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_of(p):
    """zero.Init's chunk of ``p`` on this rank, or None when ``p`` is not partitioned by Init."""
    return getattr(p, "_dsl_shard", None)


def _free(p: torch.Tensor) -> None:
    empty = torch.empty(p.shape, dtype=p.dtype, device=p.device)
    empty.untyped_storage().resize_(0)
    p.data = empty


def partition_param(p: torch.nn.Parameter) -> None:
    """Broadcast ``p`` from rank 0, keep this rank's chunk, free the whole tensor."""
    rank, world = _world()
    with torch.no_grad():
        if world > 1:
            dist.broadcast(p.data, 0)
        flat = p.data.reshape(-1)
        c = -(-flat.numel() // world)
        shard = torch.zeros(c, dtype=p.dtype, device=p.device)
        lo, hi = rank * c, min(flat.numel(), (rank + 1) * c)
        if lo < hi:
            shard[: hi - lo].copy_(flat[lo:hi])
    p._dsl_shard = shard
    _free(p)
    set_ds_attributes(p, shard, ZeroParamStatus.NOT_AVAILABLE)


def _gather_param(p) -> None:
    """Make an Init-partitioned parameter whole again (its shard stays)."""
    rank, world = _world()
    shard = p._dsl_shard
    with torch.no_grad():
        padded = torch.empty(shard.numel() * world, dtype=shard.dtype, device=shard.device)
        if world > 1:
            comm.all_gather_single(padded, shard)
        else:
            padded.copy_(shard)
        whole = padded[: p.numel()].view(p.shape).clone()
    p.data = whole
    p.ds_status = ZeroParamStatus.AVAILABLE


def _repartition(p, modifier_rank) -> None:
    rank, world = _world()
    with torch.no_grad():
        if modifier_rank is not None:
            if world > 1:
                dist.broadcast(p.data, modifier_rank)
            flat = p.data.reshape(-1)
            c = p._dsl_shard.numel()
            lo, hi = rank * c, min(flat.numel(), (rank + 1) * c)
            p._dsl_shard.zero_()
            if lo < hi:
                p._dsl_shard[: hi - lo].copy_(flat[lo:hi])
    _free(p)
    p.ds_status = ZeroParamStatus.NOT_AVAILABLE


def materialize(p) -> None:
    """Make an Init-partitioned parameter whole for good (e.g. a frozen one ZeRO does not own)."""
    if shard_of(p) is not None:
        _gather_param(p)
        del p._dsl_shard


def _config_stage(source) -> int:
    import os

    from dslaunch.config import zero_stage

    if source is None:
        source = os.environ.get("DSLAUNCH_CONFIG")
        if not source:
            return 0
    return zero_stage(source)


_ACTIVE = []  # the Init contexts entered, innermost last
_DEPTH: dict = {}  # id(module) -> how deep in its __init__ chain we are
_SAVED: dict = {}  # class -> its original __init__ (while patched)


def _all_module_classes():
    out, todo = [], [torch.nn.Module]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _wrap_init(cls):
    if "__init__" not in cls.__dict__ or cls in _SAVED:
        return
    orig = cls.__dict__["__init__"]

    @functools.wraps(orig)
    def init(self, *args, **kwargs):
        depth = _DEPTH.get(id(self), 0)
        _DEPTH[id(self)] = depth + 1
        try:
            orig(self, *args, **kwargs)
        finally:
            if depth:
                _DEPTH[id(self)] = depth
            else:
                _DEPTH.pop(id(self), None)
        if depth == 0 and _ACTIVE:
            for p in self.parameters():
                if shard_of(p) is None:
                    partition_param(p)

    _SAVED[cls] = orig
    cls.__init__ = init


def _apply(self, fn):
    """nn.Module.apply under Init: fn sees each module's own parameters whole (rank 0's result
    is kept)."""
    for child in self.children():
        child.apply(fn)
    own = [p for p in self.parameters(recurse=False) if shard_of(p) is not None]
    with GatheredParameters(own, modifier_rank=0):
        fn(self)
    return self


class Init(contextlib.ContextDecorator):
    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None, **kwargs):
        source = config_dict_or_path if config_dict_or_path is not None else config
        self.enabled = bool(enabled) and _config_stage(source) == 3
        self.dtype = dtype
        self._orig_subclass = self._orig_apply = None
        if self.enabled and module is not None:  # DeepSpeed: Init(module=m) partitions m now
            for p in module.parameters():
                if shard_of(p) is None:
                    from dslaunch.engine.comm.collectives import init_distributed

                    init_distributed()
                    partition_param(p)

    def __enter__(self):
        if not self.enabled:
            return self
        from dslaunch.engine.comm.collectives import init_distributed

        init_distributed()
        if not _ACTIVE:
            for cls in _all_module_classes():
                _wrap_init(cls)
            self._orig_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

            def init_subclass(cls, **kw):  # classes defined inside the block
                super(torch.nn.Module, cls).__init_subclass__(**kw)
                _wrap_init(cls)
            torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
            self._orig_apply = torch.nn.Module.apply
            torch.nn.Module.apply = _apply
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        _ACTIVE.pop()
        if not _ACTIVE:
            for cls, orig in list(_SAVED.items()):
                cls.__init__ = orig
            _SAVED.clear()
            if self._orig_subclass is None:
                del torch.nn.Module.__init_subclass__
            else:
                torch.nn.Module.__init_subclass__ = self._orig_subclass
            torch.nn.Module.apply = self._orig_apply
        return False


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Stage 3 gathers a module's own parameters around its forward; a forward that also reads
    ``parameter`` (owned by another module) must say so here, before ``dslaunch.initialize``."""
    ext = module.__dict__.setdefault("_dsl_external_params", [])
    if all(p is not parameter for p in ext):
        ext.append(parameter)


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    ext = module.__dict__.get("_dsl_external_params", [])
    module.__dict__["_dsl_external_params"] = [p for p in ext if p is not parameter]


def _as_list(params):
    if isinstance(params, torch.Tensor):
        return [params]
    return [p for p in params if isinstance(p, torch.Tensor)]


class GatheredParameters(contextlib.ContextDecorator):
    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.params = _as_list(params) if params is not None else []
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self._init_params, self._handles = [], []

    def __enter__(self):
        if not self.enabled:
            return self.params
        self._init_params = [p for p in self.params if shard_of(p) is not None]
        for p in self._init_params:
            _gather_param(p)
        ids = {id(p) for p in self.params}
        for strategy in list(LIVE_STRATEGIES):
            gather = getattr(strategy, "gather_params", None)
            if gather is not None and strategy.owns(ids):
                self._handles.append((strategy, gather(self.params)))
        return self.params

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        modifier = self.modifier_rank if exc[0] is None else None
        for p in self._init_params:
            _repartition(p, modifier)
        for strategy, handle in self._handles:
            strategy.release_params(handle, modifier)
        if modifier is None or self._init_params or self._handles:
            return False
        # whole parameters (stages 0-2): rank r's values everywhere, masters refreshed
        rank, world = _world()
        if world > 1:
            with torch.no_grad():
                for p in self.params:
                    dist.broadcast(p.data, src=modifier)
        ids = {id(p) for p in self.params}
        for strategy in list(LIVE_STRATEGIES):
            owned = getattr(strategy, "owns", None)
            if owned is not None and owned(ids):
                strategy.sync_from_model()
        return False
