"""``engine.offload_states()`` / ``engine.reload_states()``: DeepSpeed 0.19's way to free the
accelerator between phases (RLHF trainers put the actor's optimizer to sleep while they generate).

``offload_states(include=None, device=OffloadDeviceEnum.cpu, pin_memory=True,
non_blocking=False)`` moves the engine's training states of the kinds in ``include`` (all by
default) to host memory; ``reload_states(non_blocking=False)`` moves them back where they were.
The kinds (``OffloadStateTypeEnum``), as they map onto dslaunch's strategies:

- ``optim_states``: the optimizer's state tensors (Adam's moments);
- ``hp_params``: what the optimizer steps (the fp32 masters; the model's own parameters when it
  trains in fp32 without masters);
- ``lp_params``: the model's parameters in the training dtype (under ZeRO-3, this rank's shards);
- ``lp_grads``: the parameters' ``.grad``;
- ``contiguous_grad_buffer``: every other tensor the strategy holds (its flat gradient buckets
  and shards, communication buffers).

Tensors are moved by storage: every tensor the engine holds that shares a moved storage (a
parameter's ``.grad`` that is a view of a flat bucket, say) is re-pointed at the new one, views
stay views, and the old storage is freed. A kind that is already where it is asked to go is left
alone: on a host without an accelerator the states live in host memory already and nothing moves
(the calls succeed; there is nothing to free). As in DeepSpeed: an engine without an optimizer, an
``nvme`` device and parameters offloaded by ``offload_param`` are errors; ``device="none"`` warns
and does nothing. Training is refused until ``reload_states()``.
"""

from __future__ import annotations

import warnings

import torch

from dslaunch.config.enums import OffloadDeviceEnum, OffloadStateTypeEnum

KINDS = tuple(OffloadStateTypeEnum)


def _key(t: torch.Tensor):
    s = t.untyped_storage()
    return s.device, s.data_ptr()


def _tensors_in(obj, out: list, seen: set) -> None:
    """The tensors held by ``obj``: containers and dslaunch's own objects are searched (not
    torch modules, process groups or other libraries' objects)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.is_leaf and obj.grad is not None:
            out.append(obj.grad)
        return
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            _tensors_in(k, out, seen)
            _tensors_in(v, out, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _tensors_in(v, out, seen)
    elif isinstance(obj, torch.optim.Optimizer):
        _tensors_in(obj.state, out, seen)
        _tensors_in(obj.param_groups, out, seen)
    elif type(obj).__module__.startswith("dslaunch.") and hasattr(obj, "__dict__") \
            and not isinstance(obj, torch.nn.Module):
        _tensors_in(vars(obj), out, seen)


def _kinds(engine) -> dict:
    """kind -> the tensors of that kind (a storage may be in several kinds)."""
    strategy, opt = engine.strategy, engine.strategy.optimizer
    kinds = {k: [] for k in KINDS}
    _tensors_in(opt.state, kinds[OffloadStateTypeEnum.optim_states], set())
    hp = [p for g in opt.param_groups for p in g["params"]]
    kinds[OffloadStateTypeEnum.hp_params] = hp
    lp = list(engine.module.parameters())
    if hasattr(strategy, "local_param_shards"):  # ZeRO-3: the released parameters' elements
        lp += [t for t in strategy.local_param_shards() if isinstance(t, torch.Tensor)]
    kinds[OffloadStateTypeEnum.lp_params] = lp
    kinds[OffloadStateTypeEnum.lp_grads] = [p.grad for p in lp + hp
                                            if isinstance(p, torch.Tensor) and p.grad is not None]
    everything: list = []
    _tensors_in(strategy, everything, set())
    named = {_key(t) for ts in kinds.values() for t in ts}
    kinds[OffloadStateTypeEnum.contiguous_grad_buffer] = [t for t in everything
                                                          if _key(t) not in named]
    return kinds


def _all_holders(engine) -> list:
    """Every tensor the engine holds (to re-point those sharing a moved storage)."""
    out: list = []
    _tensors_in(engine.strategy, out, set())
    for p in engine.module.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
    return out


def _repoint(t: torch.Tensor, storage) -> None:
    view = torch.empty(0, dtype=t.dtype, device=storage.device)
    view.set_(storage, t.storage_offset(), t.size(), t.stride())
    t.data = view


def _move(storage, device: torch.device, pin: bool, non_blocking: bool):
    new = torch.UntypedStorage(storage.nbytes(), device=device)
    if pin and new.device.type == "cpu" and torch.cuda.is_available():
        new = new.pin_memory()
    new.copy_(storage, non_blocking=non_blocking)
    return new


class StateOffloader:
    """One per engine: what was moved, so that ``reload`` puts it back."""

    def __init__(self, engine):
        self.engine = engine
        self.moved: list = []  # (original device, new storage, [tensors re-pointed])
        self.offloaded: set = set()  # the kinds offloaded now

    def offload(self, include=None, device=OffloadDeviceEnum.cpu, pin_memory=True,
                non_blocking=False) -> None:
        engine = self.engine
        if not engine._trains:
            raise ValueError("offload_states: this engine was built without an optimizer; "
                             "there are no training states to move (as in DeepSpeed)")
        device = OffloadDeviceEnum(getattr(device, "value", device))
        if device == OffloadDeviceEnum.none:
            warnings.warn("offload_states: device is 'none': nothing moved", stacklevel=3)
            return
        if device == OffloadDeviceEnum.nvme:
            raise ValueError("offload_states: device 'nvme' is not supported (as in DeepSpeed); "
                             "use 'cpu'")
        zero = engine._config.zero_optimization
        if zero.offload_param is not None and str(getattr(zero.offload_param.device, "value",
                                                          zero.offload_param.device)) != "none":
            raise ValueError("offload_states: the parameters are offloaded already "
                             "(zero_optimization.offload_param); moving states across devices "
                             "is not supported with it (as in DeepSpeed)")
        wanted = [OffloadStateTypeEnum(getattr(k, "value", k)) for k in
                  (include if include is not None else KINDS)]
        target = torch.device("cpu")
        kinds = _kinds(engine)
        storages = {}
        for kind in wanted:
            for t in kinds[kind]:
                # a storage of no bytes is a ZeRO-3 parameter released at rest: it holds nothing
                # to move, and its tensors keep their shapes (re-pointing them at a new storage
                # of no bytes would resize it, which pinned host memory refuses)
                if t.device != target and t.untyped_storage().nbytes() > 0:
                    storages.setdefault(_key(t), t.untyped_storage())
        holders: dict = {}
        for t in _all_holders(engine) + [t for ts in kinds.values() for t in ts]:
            k = _key(t)
            if k in storages:
                holders.setdefault(k, {})[id(t)] = t
        for k, storage in storages.items():
            new = _move(storage, target, pin_memory, non_blocking)
            ts = list(holders[k].values())
            for t in ts:
                _repoint(t, new)
            self.moved.append((storage.device, new, ts))
        self.offloaded.update(wanted)

    def reload(self, non_blocking: bool = False) -> None:
        if not self.engine._trains:
            raise ValueError("reload_states: this engine was built without an optimizer")
        for device, storage, ts in self.moved:
            new = _move(storage, device, False, non_blocking)
            for t in ts:
                _repoint(t, new)
        self.moved, self.offloaded = [], set()

    def check_loaded(self, what: str) -> None:
        # by kind, not by what moved: a script behaves the same with and without an accelerator
        if self.offloaded:
            kinds = ", ".join(sorted(k.value for k in self.offloaded))
            raise RuntimeError(f"engine.{what}: the training states ({kinds}) are offloaded; "
                               "call engine.reload_states() first")
