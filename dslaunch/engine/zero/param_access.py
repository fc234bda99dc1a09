"""One parameter's fp32 value, gradient or optimizer state, whole, whatever the ZeRO stage keeps
of it on this rank: DeepSpeed's ``safe_get_full_fp32_param`` family (public in
``dslaunch.utils``).

Stage 0 keeps everything whole on every rank (fp32 masters beside bf16/fp16 weights). Stages 1-3
keep, per optimizer group, this rank's chunk of every bucket (``partition.py``) of the fp32
masters (in fp32 without offload: of the parameters themselves), of the reduced gradients and of
each optimizer state. A parameter sits in one bucket, so a rank holds at most one piece of it;
a whole value is assembled from every rank's piece with one all-reduce of a zero-filled buffer
(the pieces do not overlap). So the ``*_full_*`` getters are collective on ZeRO 1-3: every
data-parallel rank calls them, in the same order. The setters take the same whole value on every
rank and write this rank's piece (plus the whole low-precision copy where the rank keeps one);
``safe_get_local_*`` return this rank's piece, 1-D (ZeRO 1-3; None at stage 0, where nothing is
partitioned).

The strategy owning a parameter is found in ``zero_init``'s registry, as ``GatheredParameters``
finds it; a parameter no strategy trains (frozen, or outside any engine) gives None. Gradients:
between the backward of an accumulation boundary and ``engine.step()``, the averaged gradient the
optimizer will step with, in fp32, the fp16 loss scale divided out; None where the strategy holds
none (stage 1 between boundaries).
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.zero.stage3_fetch import RELEASED
from dslaunch.engine.zero.zero_init import LIVE_STRATEGIES


def _owner(param):
    ids = {id(param)}
    for strategy in list(LIVE_STRATEGIES):
        owns = getattr(strategy, "owns", None)
        if owns is not None and owns(ids):
            return strategy
    return None


class _Where:
    """Where a parameter's elements are in a ZeRO 1-3 strategy: group ``gi``, bucket ``bi``,
    and this rank's piece: elements [lo, hi) of the flat parameter at ``off`` in its chunk."""

    def __init__(self, strategy, param):
        self.strategy = strategy
        for gi, g in enumerate(strategy.groups):  # noqa: B007 - gi and g are kept after the break
            name = next((n for n, p in g.params.items() if p is param), None)
            if name is not None:
                break
        self.gi, self.g = gi, g
        self.bi, self.slot = next((bi, s) for bi, b in enumerate(g.layout.buckets)
                                  for s in b.slots if s.name == name)
        c = g.layout.buckets[self.bi].chunk(g.layout.world_size)
        c_lo = strategy.rank * c
        lo, hi = max(self.slot.start, c_lo), min(self.slot.start + self.slot.numel, c_lo + c)
        self.piece = (lo - self.slot.start, hi - self.slot.start, lo - c_lo) if lo < hi else None

    def chunk(self, shard: torch.Tensor) -> torch.Tensor:
        """This bucket's chunk of a group shard (a rank's chunks of every bucket, concatenated)."""
        return P.shard_chunks(shard, self.g.layout)[self.bi]

    def local(self, chunk: torch.Tensor) -> torch.Tensor:
        if self.piece is None:
            return chunk.new_zeros(0, dtype=torch.float32)
        lo, hi, off = self.piece
        return chunk[off: off + hi - lo].float().clone()

    def full(self, chunk: torch.Tensor) -> torch.Tensor:
        """The whole parameter-shaped value from every rank's ``chunk`` (collective)."""
        s = self.strategy
        out = torch.zeros(self.slot.numel, dtype=torch.float32, device=s.device)
        if self.piece is not None:
            lo, hi, off = self.piece
            out[lo:hi].copy_(chunk[off: off + hi - lo])
        if s.world > 1:  # over the ranks the shards are spread on (a MiCS shard group)
            getattr(s, "part_comm", s.comm).all_reduce(out)
        return out.view(self.slot.shape)

    def write(self, chunk: torch.Tensor, value: torch.Tensor) -> None:
        """This rank's piece of the whole ``value`` into ``chunk``."""
        if self.piece is not None:
            lo, hi, off = self.piece
            chunk[off: off + hi - lo].copy_(value.reshape(-1)[lo:hi])


# -- where each kind of value lives ---------------------------------------------------------------

def _partitioned(strategy) -> bool:
    return hasattr(strategy, "groups")  # ZeRO 1-3; stage 0 (and 1-bit) keep whole tensors


def _masters(strategy):
    """The NVMe swap keeps the fp32 masters in a file between steps: make them resident."""
    masters_in = getattr(strategy, "masters_in", None)
    return masters_in if masters_in is not None else lambda write=False: contextlib.nullcontext()


def _param_chunk(w: _Where) -> torch.Tensor:
    s, g = w.strategy, w.g
    if g.master is not None:
        return w.chunk(g.master)
    if s.stage == 3:
        return w.chunk(s.store.read_shard(w.gi))
    return g.chunks[w.bi]  # fp32 stages 1-2: the optimizer steps views of the flat parameters


def _grad_chunk(w: _Where):
    s = w.strategy
    if s.stage == 1:
        chunks = s._stage1_grad_chunks  # reduced at the boundary, until the step
        return chunks[w.gi][w.bi] if chunks else None
    return w.chunk(w.g.grad_shard)


def _state_chunk(w: _Where, key: str):
    value = w.strategy.optimizer.state.get(w.g.shard_params[w.bi], {}).get(key)
    return _per_element(value, w.g.shard_params[w.bi], key)


def _per_element(value, like: torch.Tensor, key: str):
    if value is None:
        return None  # no such state (yet: before the first step)
    if not torch.is_tensor(value) or value.numel() != like.numel():
        raise ValueError(f"optimizer state {key!r} is not a per-element tensor")
    return value


def _optimizer_states(strategy):
    """The NVMe swap keeps the states in a file between steps: read them in for the block."""
    swapped_in = getattr(strategy.optimizer, "swapped_in", None)
    return swapped_in() if swapped_in is not None else contextlib.nullcontext()


def _unscaled(strategy, grad: torch.Tensor) -> torch.Tensor:
    scale = getattr(getattr(strategy.precision, "scaler", None), "loss_scale", 1.0)
    return grad if scale == 1.0 else grad / scale


def _stage0_state_owner(strategy, param):
    return strategy.masters[param] if strategy.masters is not None else param


# -- the public calls -----------------------------------------------------------------------------

def safe_get_full_fp32_param(param):
    """The whole fp32 value of ``param`` (its fp32 master in bf16/fp16), a new tensor."""
    s = _owner(param)
    if s is None:
        return None
    if not _partitioned(s):
        return _stage0_state_owner(s, param).detach().float().clone()
    with _masters(s)():
        w = _Where(s, param)
        return w.full(_param_chunk(w))


def safe_set_full_fp32_param(param, value: torch.Tensor) -> None:
    """Make ``value`` (the same on every rank) the fp32 value of ``param``: its master and its
    training-dtype copy."""
    s = _owner(param)
    if s is None:
        raise ValueError("safe_set_full_fp32_param: no dslaunch engine trains this parameter")
    value = value.detach().reshape(param.shape)
    with torch.no_grad():
        if not _partitioned(s):
            if s.masters is not None:
                s.masters[param].copy_(value)
            param.data.copy_(value)
            return
        with _masters(s)(write=True):
            w = _Where(s, param)
            if w.g.master is not None:
                w.write(w.chunk(w.g.master), value)
            if s.stage < 3:
                param.data.copy_(value)  # whole on every rank (the fp32 chunks are its views)
                return
            key = (w.gi, w.bi)
            chunk = w.chunk(s.store.read_shard(w.gi)).clone()
            w.write(chunk, value)
            s.store.write_chunk(key, chunk)
            if s.store.state[key] != RELEASED:  # gathered now (persistent, or in a gather)
                s.store.wait(key)
                s.store.param_view(key, w.slot).copy_(value)


def safe_get_full_grad(param):
    """The whole averaged gradient of ``param`` in fp32, or None."""
    s = _owner(param)
    if s is None:
        return None
    if not _partitioned(s):
        view = s.views.get(param)
        return None if view is None else _unscaled(s, view.detach().float().clone())
    w = _Where(s, param)
    chunk = _grad_chunk(w)
    return None if chunk is None else _unscaled(s, w.full(chunk))


def safe_get_full_optimizer_state(param, optim_state_key: str):
    """The whole optimizer state ``optim_state_key`` (``"exp_avg"``, ...) of ``param``, or None
    before the optimizer made it."""
    s = _owner(param)
    if s is None:
        return None
    with _optimizer_states(s):
        if not _partitioned(s):
            value = s.optimizer.state.get(_stage0_state_owner(s, param), {}).get(optim_state_key)
            value = _per_element(value, param, optim_state_key)
            return None if value is None else value.detach().float().clone().view(param.shape)
        w = _Where(s, param)
        chunk = _state_chunk(w, optim_state_key)
        return None if chunk is None else w.full(chunk)


def safe_set_full_optimizer_state(param, value: torch.Tensor, optim_state_key: str) -> None:
    """Make ``value`` (the same on every rank) the optimizer state ``optim_state_key`` of
    ``param``; the state must exist (after the first step)."""
    s = _owner(param)
    if s is None:
        raise ValueError("safe_set_full_optimizer_state: no dslaunch engine trains this parameter")
    if hasattr(s.optimizer, "swapped_in"):
        raise NotImplementedError("safe_set_full_optimizer_state: not with optimizer states on "
                                  "NVMe (offload_optimizer.device: nvme)")
    with torch.no_grad():
        if not _partitioned(s):
            owner = _stage0_state_owner(s, param)
            target = _per_element(s.optimizer.state.get(owner, {}).get(optim_state_key), param,
                                  optim_state_key)
        else:
            w = _Where(s, param)
            target = _state_chunk(w, optim_state_key)
        if target is None:
            raise KeyError(f"the optimizer has no state {optim_state_key!r} for this parameter "
                           "yet (it makes its states at the first step)")
        if not _partitioned(s):
            target.copy_(value.detach().reshape(target.shape))
        else:
            w.write(target, value.detach())


# -- this rank's piece (ZeRO 1-3) -----------------------------------------------------------------

def _local(param, read):
    s = _owner(param)
    if s is None or not _partitioned(s):
        return None
    w = _Where(s, param)
    chunk = read(w)
    return None if chunk is None else w.local(chunk)


def safe_get_local_fp32_param(param):
    """This rank's piece of ``param``'s fp32 value (1-D, possibly empty)."""
    s = _owner(param)
    with _masters(s)() if s is not None else contextlib.nullcontext():
        return _local(param, _param_chunk)


def safe_get_local_grad(param):
    """This rank's piece of ``param``'s averaged gradient (1-D, fp32), or None."""
    s = _owner(param)
    piece = _local(param, _grad_chunk)
    return None if piece is None else _unscaled(s, piece)


def safe_get_local_optimizer_state(param, optim_state_key: str):
    """This rank's piece of ``param``'s optimizer state ``optim_state_key`` (1-D), or None."""
    s = _owner(param)
    with _optimizer_states(s) if s is not None else contextlib.nullcontext():
        return _local(param, lambda w: _state_chunk(w, optim_state_key))
