"""ZeRO stage 3: parameters, gradients and optimizer states all partitioned over data parallel.

Each rank keeps only its shard of the parameters (``stage3_fetch.ParamStore``: the one seam that
says where the shard lives: on the device, on the CPU with ``offload_param: cpu``, or in a file
with ``nvme``, ``nvme/param_store.py``, which also makes the rank keep fp32 masters), plus its fp32
master / optimizer / gradient shards as stage 2 does. Parameters are gathered per fetch unit (the
parameters a module owns directly, ``stage3_units.py``):

- forward: a pre-hook gathers the module's unit (waiting for it if a prefetch is in flight) and
  prefetches the next units of the recorded order; a post-hook releases it, unless backward will
  need it again within ``stage3_max_reuse_distance`` elements (``stage3_fetch.py``);
- backward: a hook on the module's outputs gathers the unit again just before the module's
  backward runs (and prefetches the units before it); when the last gradient of a bucket has been
  accumulated (post-accumulate-grad hooks), the bucket's gradients are reduce-scattered into this
  rank's gradient shard, freed, and the bucket's parameters released. So whole gradients never
  exist for more than the units in backward at that moment;
- a parameter read by a forward other than its module's (``F.linear(x, self.out_proj.weight)``
  in ``nn.MultiheadAttention``, a tied weight, a parent reading a child's weight) is gathered at
  that read and fetched with the reading module from then on (``stage3_access.py``);
- small parameters (``stage3_param_persistence_threshold``) stay gathered on every rank; their
  gradients are reduce-scattered like the others and the parameters re-gathered after the step.

Collectives are issued in the same order on every rank: forward in module order, backward in
autograd's (deterministic) order, leftovers in bucket order at the end of backward. Prefetches are
``async_op=True`` all-gathers, all waited by the end of the backward that follows (or the
next forward).

Models built under ``dslaunch.zero.Init`` arrive partitioned per parameter; the constructor
regroups them unit by unit (one bucket whole at a time), never the whole model. Checkpoints are
the stage 1-2 format (``checkpoint/zero_shards.py``): the layout metadata names which elements
each rank holds, so ``dslaunch ckpt to-fp32|reshape`` read them unchanged.
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.engine.base.memory import breakdown, optimizer_state_tensors
from dslaunch.engine.zero.base import OptimizerStrategy
from dslaunch.engine.zero.common import BufferPool, get_comm, offloads_optimizer
from dslaunch.engine.zero.grad_reduce import COMM_BUCKET_CAP
from dslaunch.engine.zero.nvme.param_store import nvme_param_store
from dslaunch.engine.zero.offload_pipeline import HostOffload
from dslaunch.engine.zero.param_status import attach_ds_attributes
from dslaunch.engine.zero.quantized_comm import ZeroPPComm
from dslaunch.engine.zero.stage3_access import gather_on_read
from dslaunch.engine.zero.stage3_fetch import (
    RELEASED,
    FetchCoordinator,
    HostParamStore,
    ParamStore,
)
from dslaunch.engine.zero.stage3_groups import Stage3Comms
from dslaunch.engine.zero.stage3_units import plan_units
from dslaunch.engine.zero.stage12 import ZeroStage12Strategy
from dslaunch.engine.zero.zero_init import materialize, register_strategy, shard_of


class _Group:
    """One optimizer param group, with the attributes stage12's step/checkpoint code reads."""

    def __init__(self, named, layout, rank):
        self.names = [n for n, _ in named]
        self.params = {n: p for n, p in named}
        self.layout = layout
        self.rank = rank
        self.grad_flat = None
        self.grad_shard = None
        self.master = None
        self.shard_params = []
        self.local = self.chunks = None


def _tensors(out):
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


class Stage3Strategy(ZeroStage12Strategy):
    stage = 3

    def __init__(self, model, optimizer, zero, comm, precision, aio=None):
        """``zero``: the typed ``zero_optimization`` section; ``aio``: the typed ``aio`` section
        (read when parameters or optimizer states go to NVMe)."""
        comm = get_comm(comm)
        OptimizerStrategy.__init__(self, model, optimizer, zero, comm, precision)
        self.offload_optimizer = offloads_optimizer(zero)
        named = self._trainable_groups(model, optimizer, precision)
        if zero.offload_param.device == "nvme":  # the optimizer steps an fp32 master: the
            self.need_master = True  # shard itself is in a file
        self._partition_params(model, named, comm, aio)
        self._shards_for(optimizer)
        # offload_optimizer: gradient chunks go to the host on a side stream as backward reduces
        # them, and the compiled CPU optimizer writes the 16-bit weights in its pass: straight
        # into the host shard with offload_param (offload_pipeline.py, as stages 1-2)
        # (not with offload_param: nvme, whose shard is not in memory to write)
        self.host = HostOffload(self, self._pin_host()) \
            if self.offload_optimizer and zero.offload_param.device != "nvme" else None
        register_strategy(self)
        self._install_hooks(model)

    # -- set-up ------------------------------------------------------------------------------
    def _shards_for(self, optimizer):
        """The optimizer's shard parameters (masters, or the store's chunks) and gradient
        shards, and the optimizer pointed at them."""
        for gi, g in enumerate(self.groups):
            g.chunks = self.store.chunk_views(gi)
            self._make_shard(g)
        self._install_optimizer(optimizer, [g.shard_params for g in self.groups])

    def _partition_params(self, model, named, comm, aio, fill: bool = True):
        """Plan the units of ``named`` ([[(name, param)] per group]), store this rank's shards,
        partition, get ready to gather: the set-up that needs no optimizer. ``fill=False``
        (in-process recovery): the shards stay zero and no collective runs but the host
        look-up; the values are loaded after."""
        zero = self.zero
        self.overlap_comm = False  # stage 3 reduces from its own hooks, unit by unit
        # the partition group (all data-parallel ranks, or a MiCS shard group) and the hpZ /
        # MiCS groups around it (stage3_groups.py); world and rank are within the partition
        self.comms = Stage3Comms(zero, comm)
        self.part_comm = self.comms.part
        self.dp_world = comm.world_size
        self.world, self.rank = self.part_comm.world_size, self.part_comm.rank
        self._hooks, self._stage1_grad_chunks, self._grad_norm = [], None, None
        shard_device = torch.device("cpu") if zero.offload_param.device == "cpu" else self.device
        cap = min(zero.reduce_bucket_size, COMM_BUCKET_CAP)
        self.plan = plan_units(model, named, self.world, cap,
                               zero.stage3_param_persistence_threshold)
        self.groups = [_Group(n, lay, self.rank) for n, lay in zip(named, self.plan.layouts)]
        if zero.offload_param.device == "nvme":
            self.store = nvme_param_store(self.plan, self.dtype, self.device, self.comms,
                                          zero.offload_param, aio, self.rank)
        elif zero.offload_param.device == "cpu":  # ZeRO-Infinity's CPU tier, ZeRO-Inference
            self.store = HostParamStore(self.plan, self.dtype, self.device, shard_device,
                                        self.comms, pin_memory=zero.offload_param.pin_memory)
        else:
            self.store = ParamStore(self.plan, self.dtype, self.device, shard_device, self.comms)
        self.zeropp = ZeroPPComm(zero, comm)  # qwZ / qgZ (quantized_comm.py), or neither
        self.store.quantized_gather = self.zeropp.weights
        if fill:
            self._prepare_rest(model, named)
        self._partition(fill)
        attach_ds_attributes(self)
        self.fetcher = FetchCoordinator(self.store, self.plan, zero)
        self._staging_pool = BufferPool()
        self._reset_pending()

    def _prepare_rest(self, model, named):
        """What ZeRO does not partition (buffers, frozen parameters): made whole, cast to the
        training dtype, and rank 0's values broadcast (what DDP does)."""
        ours = {id(p) for g in named for _, p in g}
        rest = [p for p in model.parameters() if id(p) not in ours]
        for p in rest:
            materialize(p)  # a frozen parameter built under zero.Init
        with torch.no_grad():
            for m in model.modules():
                for name, b in list(m._buffers.items()):
                    if b is not None and b.is_floating_point() and self.mixed:
                        m._buffers[name] = b.to(self.dtype)
            for p in rest:
                if p.is_floating_point() and self.mixed:
                    p.data = p.data.to(self.dtype)
            if self.dp_world > 1:
                for t in rest + list(model.buffers()):
                    self.comm.broadcast(t.data, 0)

    def _partition(self, fill: bool = True):
        """Bucket by bucket: assemble the bucket whole in fp32 (``_fill_bucket``; not with
        ``fill=False``), point the parameters at the bucket's full buffer, free it."""
        pin = self._pin_host()
        for gi, g in enumerate(self.groups):
            lay = g.layout
            if self.need_master:
                g.master = torch.zeros(lay.shard_numel, dtype=self.master_dtype,
                                       device=self.opt_device)
                if pin and self.opt_device.type == "cpu":
                    g.master = g.master.pin_memory()
            offsets = lay.shard_offsets()
            for bi, b in enumerate(lay.buckets):
                key = (gi, bi)
                if fill:
                    self._fill_bucket(g, key, offsets[bi])
                for s in b.slots:
                    p = g.params[s.name]
                    p.data = self.store.param_view(key, s)
                    if shard_of(p) is not None:
                        del p._dsl_shard
                self.store.release(key)  # persistent buckets stay
        self.store.live = 0

    def _fill_bucket(self, g, key, offset):
        """Assemble bucket ``key`` whole in fp32 (from the whole parameters, with rank 0's
        values broadcast, or from zero.Init's per-parameter shards) and keep this rank's chunk
        (and its fp32 master at ``offset``)."""
        b = g.layout.buckets[key[1]]
        tmp = torch.zeros(b.numel, dtype=torch.float32, device=self.device)
        whole = False
        for s in b.slots:
            p = g.params[s.name]
            view = tmp[s.start: s.start + s.numel]
            shard = shard_of(p)
            if shard is None:
                view.copy_(p.detach().reshape(-1))
                whole = True
            else:  # zero.Init: ranks hold equal chunks of the padded parameter
                padded = torch.empty(shard.numel() * self.dp_world, dtype=shard.dtype,
                                     device=self.device)
                self.comm.all_gather_into_tensor(padded, shard.to(self.device))
                view.copy_(padded[:s.numel])
                del padded
        if whole and self.dp_world > 1:
            self.comm.broadcast(tmp, 0)
        c = b.chunk(self.world)
        mine = tmp[self.rank * c: (self.rank + 1) * c]
        if g.master is not None:
            g.master[offset: offset + c].copy_(mine)
        self.store.write_chunk(key, mine)
        if key in self.plan.persistent:
            self.store.full[key].copy_(tmp)

    # -- in-process recovery (engine/recovery/) -----------------------------------
    def repartition(self) -> None:
        """Lay the parameters out over the new group (every member, as the stage-1-2 layout of
        a member whose group changed): a new plan, store and fetch state (gathers the old group
        left in flight die with it), shards, the optimizer re-pointed, the hooks again. The
        shard values are loaded from the survivors' shards after
        (``checkpoint/zero_shards.load_resharded_from``)."""
        self.remove_hooks()
        named = [list(g.params.items()) for g in self.groups]
        for group in named:
            for _, p in group:
                p.grad = None
        self._partition_params(self.model, named, self.comm, None, fill=False)
        self._shards_for(self.optimizer)
        register_strategy(self)
        self._install_hooks(self.model)

    @contextlib.contextmanager
    def dry_forward(self):
        """An abandoned step's forward (in-process recovery): the units are gathered as zeros,
        with no collective, while a replacement makes the new group's first ones. It leaves no
        trace: a throwaway fetcher records its order and the plan's units are put back (the
        next real forward must fetch as the replacement's first does, collective for
        collective)."""
        fetcher, fetch = self.fetcher, {m: list(keys) for m, keys in self.plan.fetch.items()}
        self.fetcher = FetchCoordinator(self.store, self.plan, self.zero)
        self.store.dry = True
        try:
            yield
        finally:
            self.store.dry = False
            self.fetcher.end_backward()  # releases what it gathered
            self.fetcher, self.plan.fetch = fetcher, fetch

    def _install_hooks(self, model):
        self._install_module_hooks(model)
        for g in self.groups:
            for name, p in g.params.items():
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(name)))

    def _install_module_hooks(self, model):
        self._module_hooks = [model.register_forward_pre_hook(self._begin_forward, prepend=True)]
        for m in self.plan.modules:
            self._module_hooks.append(m.register_forward_pre_hook(self._pre_forward))
            self._module_hooks.append(m.register_forward_hook(self._post_forward))
        self._module_hooks.append(model.register_forward_hook(self._end_forward))
        self._module_hooks.append(gather_on_read(self, model))

    # -- forward / backward hooks ------------------------------------------------------------
    def _begin_forward(self, module, args):
        self.fetcher.begin_forward(module.training and torch.is_grad_enabled())

    def _end_forward(self, module, args, output):
        self.fetcher.end_forward()

    def _pre_forward(self, module, args):
        self.fetcher.pre_forward(module)

    def _post_forward(self, module, args, output):
        outs = [t for t in _tensors(output) if t.requires_grad] \
            if torch.is_grad_enabled() and self.plan.fetch.get(module) else []
        self.fetcher.post_forward(module, bool(outs) and module.training)
        for t in outs:
            t.register_hook(self._pre_backward_hook(module))
        return output

    def _pre_backward_hook(self, module):
        def hook(grad):
            self.fetcher.pre_backward(module)
            return grad
        return hook

    def _grad_hook(self, name):
        key = self.plan.key_of[name]

        def hook(p):
            self._pending[key] -= 1
            if self._pending[key] == 0:
                self._reduce(key)
        return hook

    def _reset_pending(self):
        self._pending = {(gi, bi): len(b.slots) for gi, g in enumerate(self.groups)
                         for bi, b in enumerate(g.layout.buckets)}

    # -- gradient reduction, one bucket at a time ---------------------------------------------
    # _staging / _unstage: the stage-2 pool (grad_reduce.py)

    def _reduce(self, key):
        self._pending[key] = -1  # reduced for this backward
        gi, bi = key
        g = self.groups[gi]
        b = g.layout.buckets[bi]
        staging = self._staging(b.numel)
        grads = [(s, g.params[s.name].grad) for s in b.slots]
        if any(gr is None for _, gr in grads) or sum(s.numel for s in b.slots) < b.numel:
            staging.zero_()
        for s, gr in grads:
            if gr is not None:
                staging[s.start: s.start + s.numel].copy_(gr.reshape(-1))
                g.params[s.name].grad = None
        c = b.chunk(self.world)
        if self.dp_world > 1:
            send, cd = self._comm_input(key, staging)
            out = torch.empty(c, dtype=cd, device=self.device)
            if self.zeropp.gradients is not None:  # qgZ: hierarchical, quantized across hosts
                self.zeropp.gradients(out, send)
            else:
                self.comms.reduce_scatter(out, send)  # stage3_groups.py: which groups
        else:
            out = staging
        if self.host is not None:  # offload: to the host, asynchronously
            self.host.gradient(gi, bi, out, self._grad_post())
            if out is not staging:  # (one rank: the copy still reads it; a new one next time)
                self._unstage(staging)
        else:
            off = g.layout.shard_offsets()[bi]
            dst = g.grad_shard[off: off + c]
            dst.add_(out.to(device=dst.device, dtype=dst.dtype), alpha=self._grad_post())
            self._unstage(staging)
        if self.fetcher.active.get(key, 0) == 0:
            self.store.release(key)

    def after_backward(self, is_boundary: bool = True):
        self.store.wait_all()
        if is_boundary:  # offload_param: the step may write the host shards in place
            self.store.settle()
        for key in sorted(self._pending):  # buckets some of whose parameters got no gradient
            if self._pending[key] >= 0:
                self._reduce(key)
        self._reset_pending()
        if self.host is not None:
            self.host.drain()
        self.fetcher.end_backward()

    on_backward_done = after_backward

    def _offloaded_step(self, coef: float) -> None:
        """The fused offloaded step (``offload_pipeline.HostOffload.step``): the updated 16-bit
        chunks land in this rank's parameter shard (on the host with ``offload_param``, else
        uploaded to it), so only the persistent buckets are gathered again."""
        self.store.settle()  # the step writes the host shards in place
        self.updating = True
        self.host.step(coef)
        self.version += 1
        self._stage1_grad_chunks = None
        with torch.no_grad():
            self.store.weights_changed()
            self.store.refresh_persistent()
        self.updating = False
        if self.copies is not None:
            self.copies.exchange(self)

    def _grad_post(self) -> float:
        return 1.0 / self.dp_world if self.average_gradients else 1.0

    def _norm_comm(self):
        """Each partition group holds every gradient element once (MiCS replicas hold the
        same shards again)."""
        return self.part_comm

    def _all_gather_params(self):
        """After the step the new values only need to reach the local shard (and the persistent
        parameters, which every rank keeps whole)."""
        self.store.weights_changed()
        with torch.no_grad():
            if self.need_master and getattr(self.optimizer, "swap_params", False) and \
                    not getattr(self, "masters_resident", False):  # masters in the NVMe file
                for gi, bi, chunk in self._master_chunks():
                    self.store.write_chunk((gi, bi), chunk)
            elif self.need_master:
                for gi, g in enumerate(self.groups):
                    self.store.write_shard(gi, g.master)
            self.store.refresh_persistent()

    # -- whole weights, bucket by bucket -------------------------------------------------------
    def _each_bucket(self):
        """Yields (key, group, bucket) with the bucket gathered; re-releases it afterwards."""
        for gi, g in enumerate(self.groups):
            for bi, b in enumerate(g.layout.buckets):
                key = (gi, bi)
                was = self.store.state[key]
                self.store.gather(key, exact=True)
                yield key, g, b
                if was == RELEASED:
                    self.store.release(key)

    def module_state_dict(self, keep: bool = True) -> dict:
        """The whole weights; ``keep=False``: only take part in the gathers ({})."""
        values = {}
        for key, g, b in self._each_bucket():
            for s in b.slots if keep else ():
                values[id(g.params[s.name])] = self.store.param_view(key, s).detach().clone()
        if not keep:
            return {}
        return {k: values[id(v)] if id(v) in values else v.detach().clone()
                for k, v in self.model.state_dict(keep_vars=True).items()}

    def load_module_state_dict(self, sd: dict, strict: bool = True) -> None:
        mine = self.model.state_dict(keep_vars=True)
        if strict:
            missing = [k for k in mine if k not in sd]
            extra = [k for k in sd if k not in mine]
            if missing or extra:
                raise RuntimeError(f"state dict does not fit the model: missing {missing[:5]}, "
                                   f"unexpected {extra[:5]}")
        ours = {id(p) for g in self.groups for p in g.params.values()}
        for k, v in sd.items():
            if k in mine and tuple(mine[k].shape) != tuple(v.shape):
                raise RuntimeError(f"tensor {k!r} is {list(v.shape)} in the state dict but "
                                   f"{list(mine[k].shape)} in the model")
        with torch.no_grad():
            for key, _, b in self._each_bucket():
                for s in b.slots:
                    if s.name in sd:
                        self.store.param_view(key, s).copy_(sd[s.name])
                c = b.chunk(self.world)
                chunk = self.store.full[key][self.rank * c: (self.rank + 1) * c]
                self.store.write_chunk(key, chunk)
            rest = {k: v for k, v in sd.items() if k in mine and id(mine[k]) not in ours}
            self.model.load_state_dict(rest, strict=False)

    def sync_from_model(self) -> None:
        if self.need_master:
            with torch.no_grad():
                for gi, g in enumerate(self.groups):
                    g.master.copy_(self.store.read_shard(gi))

    # -- zero.GatheredParameters -------------------------------------------------------------
    def gather_params(self, params) -> list:
        """Gather the buckets holding ``params`` (collective); returns what to pass back."""
        names = {id(p): n for g in self.groups for n, p in g.params.items()}
        keys = sorted({self.plan.key_of[names[id(p)]] for p in params if id(p) in names})
        was = [self.store.state[k] for k in keys]
        for k in keys:
            self.store.gather(k, exact=True)
        return list(zip(keys, was))

    def release_params(self, handle, modifier_rank=None) -> None:
        """Re-partition after GatheredParameters; with ``modifier_rank`` its values win
        everywhere and reach the shards and fp32 masters."""
        with torch.no_grad():
            for key, was in handle:
                if modifier_rank is not None:
                    gi, bi = key
                    g, full = self.groups[gi], self.store.full[key]
                    if self.dp_world > 1:
                        self.comm.broadcast(full, modifier_rank)
                    c = g.layout.buckets[bi].chunk(self.world)
                    mine = full[self.rank * c: (self.rank + 1) * c]
                    self.store.write_chunk(key, mine)
                    if g.master is not None:
                        off = g.layout.shard_offsets()[bi]
                        g.master[off: off + c].copy_(mine)
                if was == RELEASED:
                    self.store.release(key)

    def local_param_shards(self) -> list:
        """This rank's parameter shard per optimizer group (see ``ParamStore``)."""
        return self.store.local_shards()

    # -- accounting ----------------------------------------------------------------------------
    def memory_breakdown(self) -> dict:
        params = self.store.resident_tensors() + list(self.store.full.values()) + \
            self.store.secondary_tensors()
        seen = {id(p) for g in self.groups for p in g.params.values()}
        params += [p for p in self.model.parameters() if id(p) not in seen]
        grads = [g.grad_shard for g in self.groups if g.grad_shard is not None]
        grads += [p.grad for p in self.model.parameters() if p.grad is not None]
        opt = [g.master for g in self.groups if g.master is not None]
        out = breakdown(params, grads, opt + optimizer_state_tensors(self.optimizer))
        on_nvme = self.store.nvme_bytes()
        if on_nvme:  # the parameter shard's file
            for kind in ("params", "total"):
                out[kind]["nvme"] = out[kind].get("nvme", 0) + on_nvme
        return out

    def remove_hooks(self):
        super().remove_hooks()
        for h in getattr(self, "_module_hooks", []):
            h.remove()
        self._module_hooks = []

    def empty_partition_cache(self) -> None:
        """Release every gathered unit (persistent ones stay): between passes only."""
        self.fetcher.end_backward()
