"""ZeRO stages 1 and 2: optimizer states (1), and gradients too (2), partitioned over data parallel.

Every rank keeps the whole model (parameters live as views of one flat, bucketed buffer per
optimizer param group, see ``partition.py``) but owns one chunk of every bucket:

- the optimizer (the user's own object, re-pointed at shard parameters) steps only this rank's
  chunks. In fp32 the chunks *are* views of the flat parameter buffer (no extra master copy); in
  bf16/fp16, or with ``offload_optimizer``, the rank keeps fp32 master chunks (on the CPU when
  offloaded);
- after the step the updated chunks are all-gathered, bucket by bucket, into the flat buffer;
- stage 1: gradients accumulate whole (``p.grad`` are views of a flat gradient buffer laid out like
  the parameters) and are reduce-scattered at the accumulation boundary, one collective per bucket
  (on gloo that runs as an in-place all_reduce, ``engine/comm.py``: from the boundary until
  ``zero_grad`` the ``p.grad`` views then hold the sum over ranks, not this rank's gradients);
- stage 2: every micro-step, gradients are copied bucket by bucket into a reused staging buffer
  (and freed), reduce-scattered, and this rank's chunk is added to its gradient shard: the only
  gradient memory that lasts is the shard, and accumulation over micro-steps is exact. A
  post-accumulate hook per parameter stages gradients as they appear; a full bucket is
  reduce-scattered right there, synchronously with ``overlap_comm: false``, else asynchronously
  with at most ``IN_FLIGHT_BUCKETS`` in flight (our default for stage 2; DeepSpeed's is off);
- stage 3 (``stage3.py``) builds on the stage-2 path and frees the flat parameter storage at rest;
- buckets hold at most ``reduce_bucket_size`` elements, capped at ``COMM_BUCKET_CAP`` (see there).
  ``allgather_bucket_size`` is accepted; the all-gather uses the same buckets.

Gradient clipping uses the global norm (squared shard norms all-reduced with SUM, in fp64); a
non-finite norm (fp16 overflow anywhere) skips the step on every rank and lowers the loss scale
(the decision is ``engine/step_policy.py``'s, shared with stage 0 and the pipeline).
"""

from __future__ import annotations

import atexit
import math
import weakref

import torch

from dslaunch.engine.autocast import comm_dtype
from dslaunch.engine.experts import ExpertGroups, expert_group
from dslaunch.engine.memory import breakdown, optimizer_state_tensors
from dslaunch.engine.step_policy import SHARDED, GradNorm, all_reduce_sq_norm, loss_scale_of, sum_of_squares
from dslaunch.engine.zero import partition as P
from dslaunch.engine.zero.base import OptimizerStrategy, broadcast_model
from dslaunch.engine.zero.common import (
    BufferPool,
    get_comm,
    named_groups,
    offloads_optimizer,
    repoint_optimizer,
)
from dslaunch.engine.zero.offload import cpu_optimizer_for
from dslaunch.engine.zero.offload_pipeline import HostOffload, host_buffer
from dslaunch.engine.zero.zero_init import register_strategy

# gloo runs one huge reduce-scatter / all-gather several times slower than the same bytes in
# buckets of a few million elements (measured, 27M fp32 on 2 ranks: reduce_scatter 0.66 s whole,
# 0.11 s in 16 pieces; all_gather 0.53 s vs 0.09 s), so buckets are capped here whatever
# reduce_bucket_size says (DeepSpeed's default 5e8 would make one bucket of most models).
COMM_BUCKET_CAP = 1 << 21
# stage 2 with overlap_comm: reduce-scatters in flight behind backward at once. Two keep the
# exchange off the critical path (a bucket's backward takes far longer than its exchange) and
# cost two staging buffers; overlap took 27M fp32 on 2 gloo ranks from 730-760 to 660-690 ms of
# backward a step (bench_train's GPT, 2-core host)
IN_FLIGHT_BUCKETS = 2


class _Group:
    """One optimizer param group: its layout, flat buffers and shard tensors."""

    def __init__(self, named, comm, bucket_numel, expert_group=None):
        self.names = [n for n, _ in named]
        self.params = {n: p for n, p in named}
        # the ranks this group is partitioned over: the data-parallel group, or for MoE experts
        # their expert-data-parallel group (engine/experts.py)
        self.comm, self.world, self.rank = comm, comm.world_size, comm.rank
        self.expert_group = expert_group
        self.layout = P.build_layout(named, self.world, bucket_numel, kind=comm_dtype)
        # which bucket each parameter lives in
        self.bucket_of = {s.name: bi for bi, b in enumerate(self.layout.buckets) for s in b.slots}
        self.slot_of = {s.name: s for b in self.layout.buckets for s in b.slots}
        self.flat = self.buckets = self.chunks = None
        self.grad_flat = None  # stage 1: whole gradients, same layout as flat
        self.grad_shard = None  # stage 2 (param dtype) / offload (fp32 on cpu): this rank's chunks
        self.master = None  # fp32 shard when mixed precision or offload
        self.shard_params = []  # what the optimizer steps (one per bucket chunk)

    def take_master(self, device, pin=False, dtype=torch.float32):
        """Master copy (fp32, or bf16 when lean) of this rank's chunks, read from the (still
        fp32) parameters."""
        self.master = torch.zeros(self.layout.shard_numel, dtype=dtype, device=device)
        if pin:
            self.master = self.master.pin_memory()
        for _, s, lo, hi, pos in self.layout.shard_pieces(self.rank):
            src = self.params[s.name].detach().reshape(-1)[lo:hi]
            self.master[pos: pos + hi - lo].copy_(src)

    def flatten(self, dtype, device):
        self.flat = P.flatten_into(self.layout, self.params, dtype, device)
        self.buckets = P.bucket_views(self.flat, self.layout)
        self.chunks = P.chunk_views(self.flat, self.layout, self.rank)


class ZeroStage12Strategy(OptimizerStrategy):
    # in-process recovery (engine/recovery/): a copy of a neighbour's shard
    # (zero/shard_copies.py, set by the engine), the updates applied to this shard, and whether
    # an update is between its local step and the end of its all-gather
    copies = None
    version = 0
    updating = False
    host = None  # offload_optimizer: the pipelined copies (offload_pipeline.HostOffload)
    most_in_flight = 0  # the most overlapped reduce-scatters seen in flight at once (a check)

    def __init__(self, stage, model, optimizer, zero, comm=None, precision=None, aio=None):
        """``zero``: the typed ``zero_optimization`` section; ``aio``: the typed ``aio`` section
        (read by the NVMe paths only)."""
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeroStage12Strategy handles stages 1-3, not {stage}")
        comm = get_comm(comm)
        super().__init__(model, optimizer, zero, comm, precision)
        self.stage = stage
        self.offload_optimizer = offloads_optimizer(zero)
        self.overlap_comm = zero.overlap_comm
        self.world = comm.world_size
        self.rank = comm.rank
        self._grad_norm = None
        self._hooks = []
        self._stage1_grad_chunks = None

        named = self._trainable_groups(model, optimizer, precision)
        self._named = named

        self.experts = ExpertGroups(model, comm)
        broadcast_model(model, comm)  # every rank starts from rank 0's weights
        self._partition(optimizer, cast=True)
        if stage >= 2:
            # A bucket is reduced as soon as its gradients exist (at most IN_FLIGHT_BUCKETS
            # still in flight with overlap_comm), so whole gradients never exist for the whole
            # model: that is stage 2's memory saving during backward, not only after it.
            for gi, g in enumerate(self.groups if stage == 2 else []):
                for name, p in g.params.items():
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        self._make_hook(gi, name)))
            # Gradient hooks still registered when the interpreter finalises can abort the
            # process (seen with async gloo work in flight earlier): drop them at exit.
            atexit.register(_remove_hooks_at_exit, weakref.ref(self))

    # -- set-up ------------------------------------------------------------------------------
    def _partition(self, optimizer, cast: bool) -> None:
        """Lay the trainable parameters out over the group's ranks as it is now: flat buffers,
        this rank's chunks, masters, the optimizer re-pointed at them, gradient buffers.
        ``cast``: the model is still fp32 (at construction; the masters are read from it)."""
        comm, zero = self.comm, self.zero
        self.world, self.rank = comm.world_size, comm.rank
        bucket = min(zero.reduce_bucket_size, COMM_BUCKET_CAP)
        self.groups = []
        for g in self._named:
            kinds = {expert_group(p) for _, p in g}
            if len(kinds) > 1:
                raise ValueError("an optimizer param group mixes MoE expert parameters with "
                                 "others (or experts of several ep sizes); split it with "
                                 "dslaunch.moe.utils.split_params_into_different_moe_groups_"
                                 "for_optimizer")
            kind = kinds.pop() if kinds else None
            self.groups.append(_Group(g, self.experts.comm(kind, comm), bucket, kind))
        pin = self._pin_host()
        if self.need_master:
            for g in self.groups:
                g.take_master(self.opt_device, pin, self.master_dtype)
        if self.mixed and cast:
            if self.precision is not None:
                self.precision.cast_model(self.model)
            else:
                self.model.to(self.dtype)
        for g in self.groups:
            g.flatten(self.dtype, self.device)
            self._make_shard(g)
        shard_groups = [g.shard_params for g in self.groups]
        self._install_optimizer(optimizer, shard_groups)
        # offload: the copies between the device and the host, pipelined (offload_pipeline.py)
        self.host = HostOffload(self, pin) if self.offload_optimizer else None
        register_strategy(self)  # GatheredParameters(modifier_rank=...) refreshes our masters
        if self.stage == 1:
            for g in self.groups:
                g.grad_flat = torch.zeros_like(g.flat)
                self._attach_grad_views(g)
        else:
            self._staging_pool = BufferPool()
            self._in_flight = []  # (group, bucket index, work, out, staging)
            self._open = {}  # (group idx, bucket idx) -> staging buffer
            self._written = {}  # (group idx, bucket idx) -> names of the slots staged so far
            self._pending = {}
            self._reset_pending()

    def repartition(self) -> None:
        """In-process recovery: the group changed size under the strategy (a lost host, or a
        replacement built alone before it joined). Lay the parameters out over it again; the
        masters and optimizer states are then loaded from the survivors' shards
        (``checkpoint/zero_shards.load_resharded_from``)."""
        for g in self.groups:
            for p in g.params.values():
                p.grad = None
        self._partition(self.optimizer, cast=False)

    def abandon(self) -> None:
        """In-process recovery: forget the interrupted step's collectives in flight."""
        self._stage1_grad_chunks = None
        if self.stage >= 2:
            self._in_flight, self._open, self._written = [], {}, {}
            self._reset_pending()
        if self.host is not None:
            self.host.abandon()
        self.zero_grad()

    def _pin_host(self) -> bool:
        """Whether host buffers are pinned: asked for, and a device that copies from them."""
        zero = self.zero
        return bool(zero.offload_optimizer is not None and zero.offload_optimizer.pin_memory) \
            and self.opt_device.type == "cpu" and self.device.type != "cpu"

    def _make_shard(self, g: _Group):
        shard_numel = g.layout.shard_numel
        if self.need_master:
            views = P.shard_chunks(g.master, g.layout)
        else:
            views = g.chunks
        g.shard_params = [torch.nn.Parameter(v) for v in views]
        if self.stage >= 2 or self.offload_optimizer:
            if self.offload_optimizer:  # the CPU step reads a gradient shard of the masters'
                g.grad_shard = host_buffer(shard_numel, self.master_dtype, self._pin_host())
            else:
                g.grad_shard = torch.zeros(shard_numel, dtype=self.dtype, device=self.device)

    def _install_optimizer(self, optimizer, shard_groups) -> None:
        """The CPU Adam over the shards when offloaded (the engine then takes it as its
        optimizer), else the user's optimizer re-pointed at them."""
        fp32_states = getattr(self.precision, "fp32_optimizer_states", True)
        cpu_opt = cpu_optimizer_for(optimizer, shard_groups, fp32_states) \
            if self.offload_optimizer else None
        if cpu_opt is not None:
            self.optimizer = cpu_opt
            return
        if self.mixed and self.master_dtype != torch.float32 and fp32_states:
            raise ValueError(
                "bf16.bf16_master_weights_and_grads: fp32 optimizer states for bf16 master "
                f"weights need the compiled CPU Adam (optimizer Adam or AdamW, the cpu_adam op "
                f"built); got {type(optimizer).__name__} without it. Set "
                "bf16.bf16_optimizer_states true to keep the states in bf16")
        repoint_optimizer(optimizer, shard_groups)

    def _attach_grad_views(self, g: _Group):
        for b, bview in zip(g.layout.buckets, P.bucket_views(g.grad_flat, g.layout)):
            for s in b.slots:
                g.params[s.name].grad = bview[s.start: s.start + s.numel].view(s.shape)

    # -- stage 2: bucketed reduce-scatter driven by gradient hooks -----------------------------
    def _reset_pending(self):
        self._pending = {(gi, bi): len(b.slots) for gi, g in enumerate(self.groups)
                         for bi, b in enumerate(g.layout.buckets)}
        self._order = sorted(self._pending)  # every rank launches buckets in this order
        self._next = 0

    def _trainable_groups(self, model, optimizer, precision) -> list:
        """The optimizer's named parameter groups; sets the training dtype, devices and whether
        fp32 masters are kept (stages 1-3 alike)."""
        named = named_groups(model, optimizer)
        first = next((p for g in named for _, p in g), None)
        if first is None:
            raise ValueError("the optimizer has no trainable parameters")
        # the engine hands us an fp32 model: the masters are taken before the model is cast
        self.dtype = precision.dtype if precision is not None else first.dtype
        if precision is not None and not precision.mixed:
            self.dtype = precision.full_dtype(p for g in named for _, p in g)
        self.device = first.device
        self.mixed = self.dtype not in (torch.float32, torch.float64)
        self.opt_device = torch.device("cpu") if self.offload_optimizer else self.device
        # bf16 master weights and grads: the optimizer steps the bf16 chunks themselves (a
        # separate master only where the step runs elsewhere: offload)
        self.master_dtype = getattr(precision, "master_dtype", torch.float32) \
            if self.mixed else self.dtype
        lean = self.master_dtype == self.dtype
        self.need_master = (self.mixed and not lean) or self.offload_optimizer
        return named

    def _staging(self, numel):
        """A reusable device buffer of ``numel`` elements (``common.BufferPool``)."""
        return self._staging_pool.take(
            numel, lambda n: torch.empty(n, dtype=self.dtype, device=self.device))

    def _unstage(self, staging):
        self._staging_pool.give(staging)

    def _make_hook(self, gi, name):
        ref = weakref.ref(self)

        def hook(p):
            self = ref()
            if self is None or p.grad is None:
                return
            key = (gi, self.groups[gi].bucket_of[name])
            self._stage_grad(key, name, p.grad)
            p.grad = None  # the gradient now lives in the bucket; free it
            self._pending[key] -= 1
            if self._pending[key] == 0:
                # launch in bucket order only, so every rank issues the same collectives in the
                # same sequence even if autograd readies the buckets in another order
                while self._next < len(self._order) and self._pending[self._order[self._next]] == 0:
                    self._launch(self._order[self._next])
                    self._next += 1
        return hook

    def _stage_grad(self, key, name, grad):
        """Write ``grad`` into its slot of the bucket's staging buffer: a copy the first time
        (no zero_() of the whole bucket then add_: that was a memset plus a read-modify-write
        of every element), an add if the same parameter reports twice. The padding is zeroed
        when the buffer opens, slots that got no gradient at launch (``_zero_unstaged_slots``)."""
        gi, bi = key
        g = self.groups[gi]
        buf = self._open.get(key)
        if buf is None:
            b = g.layout.buckets[bi]
            buf = self._staging(b.numel)
            used = sum(s.numel for s in b.slots)
            if used < b.numel:
                buf[used:].zero_()
            self._open[key] = buf
            self._written[key] = set()
        s = g.slot_of[name]
        dst = buf[s.start: s.start + s.numel]
        seen = self._written[key]
        if name in seen:
            dst.add_(grad.reshape(-1))
        else:
            dst.copy_(grad.reshape(-1))
            seen.add(name)

    def _zero_unstaged_slots(self, key, staging):
        """Zero the slots of bucket ``key`` that ``_stage_grad`` did not write this backward."""
        seen = self._written.pop(key, None)
        if seen is None:  # opened by _stage_empty (zeroed whole)
            return
        slots = self.groups[key[0]].layout.buckets[key[1]].slots
        if len(seen) < len(slots):
            for s in slots:
                if s.name not in seen:
                    staging[s.start: s.start + s.numel].zero_()

    def _stage_empty(self, key):
        gi, bi = key
        buf = self._staging(self.groups[gi].layout.buckets[bi].numel)
        buf.zero_()
        self._open[key] = buf
        self._written.pop(key, None)  # zeroed whole

    def _launch(self, key):
        gi, bi = key
        g = self.groups[gi]
        staging = self._open.pop(key)
        self._zero_unstaged_slots(key, staging)
        chunk = g.layout.buckets[bi].chunk(g.world)
        send, cd = self._comm_input(key, staging)
        out = torch.empty(chunk, dtype=cd, device=self.device)
        if self.overlap_comm:
            work = g.comm.reduce_scatter_tensor(out, send, async_op=True,
                                                     input_is_scratch=True)
            self._in_flight.append((g, bi, work, out, staging))
            # At most IN_FLIGHT_BUCKETS stay in flight (each holds its staging buffer): the
            # oldest is completed here, in the hook, as the synchronous path completes every
            # bucket. (Waits in hooks once made gloo abort at interpreter exit; the bootstrap
            # no longer runs gloo's teardown.) The rest are completed in after_backward.
            while len(self._in_flight) > IN_FLIGHT_BUCKETS:
                self._finish(*self._in_flight.pop(0))
            self.most_in_flight = max(self.most_in_flight, len(self._in_flight))
        else:
            g.comm.reduce_scatter_tensor(out, send, input_is_scratch=True)
            self._finish(g, bi, None, out, staging)

    def _finish(self, g, bi, work, out, staging):
        if work is not None:
            work.wait()
        if self.host is not None:  # offload: to the host, asynchronously
            self.host.gradient(self.groups.index(g), bi, out, self._grad_post())
            self._unstage(staging)
            return
        off = g.layout.shard_offsets()[bi]
        dst = g.grad_shard[off: off + out.numel()]
        dst.add_(out.to(device=dst.device, dtype=dst.dtype), alpha=self._grad_post())  # offload: to the CPU
        self._unstage(staging)

    # -- the engine's seam ---------------------------------------------------------------------
    def after_backward(self, is_boundary: bool = True):
        if self.stage >= 2:
            for key in self._order[self._next:]:  # buckets whose parameters went unused
                if key not in self._open:
                    self._stage_empty(key)
                self._launch(key)
            while self._in_flight:
                self._finish(*self._in_flight.pop(0))
            self._reset_pending()
            if self.host is not None:
                self.host.drain()
            return
        for g in self.groups:  # stage 1: someone may have replaced a .grad view; fold it back
            flat_ptr = (g.grad_flat.data_ptr(), g.grad_flat.data_ptr() + g.grad_flat.numel() *
                        g.grad_flat.element_size())
            for b, bview in zip(g.layout.buckets, P.bucket_views(g.grad_flat, g.layout)):
                for s in b.slots:
                    p = g.params[s.name]
                    if p.grad is not None and not (flat_ptr[0] <= p.grad.data_ptr() < flat_ptr[1]):
                        bview[s.start: s.start + s.numel].copy_(p.grad.reshape(-1))
                        p.grad = bview[s.start: s.start + s.numel].view(s.shape)
        if not is_boundary:
            return
        self._stage1_grad_chunks = []
        for gi, g in enumerate(self.groups):
            outs = []
            for bi, (b, bview) in enumerate(zip(g.layout.buckets,
                                                P.bucket_views(g.grad_flat, g.layout))):
                send, cd = self._comm_input((gi, bi), bview)
                if g.world == 1 and cd == self.dtype:
                    # one data-parallel rank (AutoTP at DP 1): the reduction is the bucket
                    # itself; no copy of the gradients (zeroed after the step anyway)
                    outs.append(bview)
                    continue
                out = torch.empty(b.chunk(g.world), dtype=cd, device=self.device)
                # the flat gradient buffer is reduced in place where the collective runs as an
                # all_reduce (gloo): it is zeroed before the next accumulation anyway
                g.comm.reduce_scatter_tensor(out, send, input_is_scratch=True)
                outs.append(out if cd == self.dtype else out.to(self.dtype))
            if g.grad_shard is not None:  # offload: fp32 shard on the CPU
                for bi, out in enumerate(outs):
                    self.host.gradient(gi, bi, out, self._grad_post())
                self.host.drain()
                outs = P.shard_chunks(g.grad_shard, g.layout)
            elif self._grad_post() != 1.0:
                for out in outs:
                    out.mul_(self._grad_post())
            self._stage1_grad_chunks.append(outs)

    # DeepSpeed-era name for the same call
    on_backward_done = after_backward

    def _comm_input(self, key, grads):
        """(what to reduce, its dtype) for bucket ``key``: the gradients themselves, or, when
        autocast gave every parameter of the bucket a lower communication dtype, a copy in it
        (``engine/autocast.py``)."""
        cd = self._bucket_comm_dtype(key)
        return (grads, cd) if cd == grads.dtype else (grads.to(cd), cd)

    def _bucket_comm_dtype(self, key):
        cache = self.__dict__.setdefault("_comm_dtypes", {})
        if key not in cache:
            g = self.groups[key[0]]
            kinds = {comm_dtype(g.params[s.name]) for s in g.layout.buckets[key[1]].slots}
            cd = kinds.pop() if len(kinds) == 1 else None
            cache[key] = cd if cd is not None else self.dtype
        return cache[key]

    def finish_accumulation(self) -> None:
        if self.stage == 1:  # stages 2-3 reduced at every backward
            self.after_backward(True)

    def _grad_post(self) -> float:
        """What the reduced (summed) gradients are multiplied by: 1/world to average them, 1 when
        ``gradient_allreduce_op`` is "sum"."""
        return 1.0 / self.world if self.average_gradients else 1.0

    def _grad_chunks(self):
        if self.stage == 1:
            return getattr(self, "_stage1_grad_chunks", None) or [
                [torch.zeros(b.chunk(g.world), dtype=self.dtype, device=self.device)
                 for b in g.layout.buckets] for g in self.groups]
        return [P.shard_chunks(g.grad_shard, g.layout) for g in self.groups]

    # -- step (base.OptimizerStrategy.step runs the policy) -------------------------------------
    step_policy = SHARDED  # a non-finite norm skips in any precision; coef = clip * (1 / scale)

    def _boundary_grad_norm(self, clip_norm, loss_scaler, fp16: bool) -> GradNorm:
        """Squared shard norms, unscaled, summed over the data-parallel group (fp64). An expert
        group's shards partition its experts within their expert-data-parallel group, so over
        all ranks every expert element is counted once too."""
        inv = 1.0 / loss_scale_of(loss_scaler)
        if self.host is not None:
            self.host.zero_unwritten()
        sq = self.host.sum_of_squares() if self.host is not None else None
        if sq is None:
            sq = sum_of_squares(c for group_chunks in self._grad_chunks() for c in group_chunks)
        sq, overflow = all_reduce_sq_norm(sq * (inv * inv), self._norm_comm().all_reduce)
        return GradNorm(math.sqrt(sq), overflow)

    def _norm_comm(self):
        """The ranks whose shards together hold every gradient element once."""
        return self.comm

    def _after_skip(self) -> None:
        self._stage1_grad_chunks = None

    def _scale_grads_and_step(self, coef: float) -> None:
        if self.host is not None and self.host.fuses(self.optimizer):
            self._offloaded_step(coef)
            return
        for g, gchunks in zip(self.groups, self._grad_chunks()):
            for sp, gc in zip(g.shard_params, gchunks):
                if self.need_master:
                    grad = gc if gc.dtype == sp.dtype and gc.device == sp.device else \
                        gc.to(device=sp.device, dtype=sp.dtype)
                else:
                    grad = gc
                if coef != 1.0:
                    grad.mul_(coef)  # gradients are consumed by this step: scale in place
                sp.grad = grad
        prepare = getattr(self.optimizer, "prepare_zero_step", None)
        if prepare is not None:  # Muon: whole-matrix updates from the shards (optim/muon_zero.py)
            prepare(self)
        self.updating = True
        self.optimizer.step()
        self.version += 1
        for g in self.groups:
            for sp in g.shard_params:
                sp.grad = None
        self._stage1_grad_chunks = None
        self._all_gather_params()
        self.updating = False
        if self.copies is not None:  # in-process recovery: the buddy's copy of this shard
            self.copies.exchange(self)

    def _offloaded_step(self, coef: float) -> None:
        """The offloaded step, pipelined (``offload_pipeline.HostOffload.step``): each chunk's
        update lands in this rank's chunk of the flat buffer, which is then all-gathered."""
        self.updating = True
        self.host.step(coef)
        self.version += 1
        self._stage1_grad_chunks = None
        if self.world > 1:
            self._all_gather_params(((gi, bi, c) for gi, g in enumerate(self.groups)
                                     for bi, c in enumerate(g.chunks)))
        self.updating = False
        if self.copies is not None:
            self.copies.exchange(self)

    def _all_gather_params(self, sources=None):
        """Every bucket's updated chunks to every rank. The buckets' all-gathers are all posted
        first and then waited for: one after another, each bucket paid the exchange's latency
        (27M fp32 parameters, 2 ranks on gloo: 58 ms in turn, 33 ms posted together). Chunks
        read from an NVMe swap file are valid only until the next is read, so those go one by
        one."""
        swapped = sources is None and self.need_master and self._masters_swapped()
        if sources is None:
            sources = self._master_chunks() if self.need_master else (
                (gi, bi, c) for gi, g in enumerate(self.groups) for bi, c in enumerate(g.chunks))
        posted = []  # (work, input): an input stays alive until its gather is done
        for gi, bi, src in sources:
            g = self.groups[gi]
            bview = g.buckets[bi]
            inp = src.to(device=self.device, dtype=self.dtype)
            if g.world == 1:  # the chunk is the bucket: nothing to gather, at most a copy
                if inp.data_ptr() != bview.data_ptr():
                    bview.copy_(inp.reshape(bview.shape))
                continue
            lo = bview.data_ptr()
            if lo <= inp.data_ptr() < lo + bview.numel() * bview.element_size() and \
                    _aliasing_refused(g.comm, inp):
                inp = inp.clone()  # gloo's own all-gather: the input must not alias the output
            if swapped:
                g.comm.all_gather_into_tensor(bview, inp)
            else:
                posted.append((g.comm.all_gather_into_tensor(bview, inp, async_op=True), inp))
        for work, _ in posted:
            work.wait()

    def _masters_swapped(self) -> bool:
        """Whether the fp32 masters are read from the optimizer's NVMe swap file now."""
        return bool(getattr(self.optimizer, "swap_params", False)) and \
            not getattr(self, "masters_resident", False)

    def _master_chunks(self):
        """(group index, bucket index, fp32 master chunk), in group and bucket order. When the
        optimizer keeps the masters in its NVMe swap file (``nvme/masters.py``) and they are not
        swapped in, they are read from the file sub-group by sub-group (each chunk is valid until
        the next is taken)."""
        opt = self.optimizer
        if self._masters_swapped():
            where = {id(sp): (gi, bi) for gi, g in enumerate(self.groups)
                     for bi, sp in enumerate(g.shard_params)}
            expect = [(gi, bi) for gi, g in enumerate(self.groups)
                      for bi in range(len(g.shard_params))]
            for n, p in enumerate(opt.iter_params()):
                if where[id(p)] != expect[n]:  # every rank must all-gather in the same order
                    raise RuntimeError("the swapped optimizer's parameters are not in shard order")
                yield (*where[id(p)], p.detach())
            return
        for gi, g in enumerate(self.groups):
            for bi, c in enumerate(P.shard_chunks(g.master, g.layout)):
                yield gi, bi, c

    def prepare_backward(self, is_boundary: bool) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True):
        if self.host is not None:  # the next backward writes every bucket of the shards afresh
            self.host.zero_grad()
        for g in self.groups:
            if g.grad_flat is not None:
                g.grad_flat.zero_()
                self._attach_grad_views(g)
            if g.grad_shard is not None and self.host is None:
                g.grad_shard.zero_()
            if self.stage >= 2:
                for p in g.params.values():
                    p.grad = None

    # -- accounting ----------------------------------------------------------------------------
    def memory_breakdown(self) -> dict:
        """Bytes this rank holds (engine/memory.py's format): the flat parameter buffers (plus
        parameters outside the optimizer), the gradient buffers, the fp32 masters and states."""
        params = [g.flat for g in self.groups] + list(self.model.parameters())
        grads = [t for g in self.groups for t in (g.grad_flat, g.grad_shard) if t is not None]
        grads += [p.grad for p in self.model.parameters() if p.grad is not None]
        opt = [g.master for g in self.groups if g.master is not None]
        return breakdown(params, grads, opt + optimizer_state_tensors(self.optimizer))

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        from dslaunch.engine.checkpoint.zero_shards import shard_state_dict

        return shard_state_dict(self)

    def load_state_dict(self, sd, load_optimizer_states: bool = True) -> None:
        from dslaunch.engine.checkpoint.zero_shards import load_shard_state_dict

        if load_optimizer_states:
            load_shard_state_dict(self, sd)
        else:
            self.sync_from_model()
        self.version += 1  # the copies of this shard (shard_copies.py) are stale until exchanged

    def load_resharded(self, ckpt_path: str) -> None:
        """Load a checkpoint written by a job with another world size (automatic reshape)."""
        from dslaunch.engine.checkpoint.zero_shards import load_resharded

        load_resharded(self, ckpt_path)
        self.version += 1

    def owns(self, param_ids) -> bool:
        return any(id(p) in param_ids for g in self.groups for p in g.params.values())

    def sync_from_model(self) -> None:
        """The model's weights were replaced (they are views of the flat buffers, so the buffers
        hold them): refresh the fp32 masters from them."""
        if not self.need_master:
            return
        with torch.no_grad():
            for g in self.groups:
                for dst, src in zip(P.shard_chunks(g.master, g.layout), g.chunks):
                    dst.copy_(src)

    def remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _aliasing_refused(comm, tensor) -> bool:
    """Whether ``comm``'s all-gather of ``tensor`` may not read its input from its output: only
    gloo's pairwise and all_reduce paths (``engine/comm.py``; pairwise is gloo's default) are known
    to allow it. (gloo's own all-gather refuses; NCCL's in-place form is untested here.)"""
    paths_for = getattr(comm, "paths_for", None)
    if paths_for is None or tensor.device.type != "cpu":
        return True
    return paths_for(tensor)["all_gather"] == "native"


def _remove_hooks_at_exit(ref):
    strategy = ref()
    if strategy is not None:
        strategy.remove_hooks()


class Stage1Strategy(ZeroStage12Strategy):
    stage = 1

    def __init__(self, model, optimizer, zero, comm, precision, aio=None):
        super().__init__(1, model, optimizer, zero, comm, precision, aio)


class Stage2Strategy(ZeroStage12Strategy):
    stage = 2

    def __init__(self, model, optimizer, zero, comm, precision, aio=None):
        super().__init__(2, model, optimizer, zero, comm, precision, aio)
