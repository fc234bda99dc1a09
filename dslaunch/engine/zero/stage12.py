"""ZeRO stages 1 and 2: optimizer states (1), and gradients too (2), partitioned over data parallel.

Every rank keeps the whole model (parameters live as views of one flat, bucketed buffer per
optimizer param group, see ``partition.py``) but owns one chunk of every bucket:

- the optimizer (the user's own object, re-pointed at shard parameters) steps only this rank's
  chunks. In fp32 the chunks *are* views of the flat parameter buffer (no extra master copy); in
  bf16/fp16, or with ``offload_optimizer``, the rank keeps fp32 master chunks (on the CPU when
  offloaded);
- gradients are reduce-scattered into this rank's chunks bucket by bucket, stage 1 at the
  accumulation boundary, stage 2 as they appear in backward (``grad_reduce.py``);
- after the step the updated chunks are all-gathered, bucket by bucket, into the flat buffer
  (``param_gather.py``);
- stage 3 (``stage3.py``) builds on the stage-2 path and frees the flat parameter storage at rest.

This module is the strategy itself: the layout and its buffers, the optimizer re-pointed at the
shards, the step, and the checkpoint and accounting seams. Gradient clipping uses the global norm
(squared shard norms all-reduced with SUM, in fp64); a non-finite norm (fp16 overflow anywhere)
skips the step on every rank and lowers the loss scale (the decision is
``engine/base/step_policy.py``'s, shared with stage 0 and the pipeline).
"""

from __future__ import annotations

import math

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.base.autocast import comm_dtype
from dslaunch.engine.base.memory import breakdown, optimizer_state_tensors
from dslaunch.engine.base.step_policy import SHARDED, GradNorm, all_reduce_sq_norm, loss_scale_of, sum_of_squares
from dslaunch.engine.parallel.experts import ExpertGroups, expert_group
from dslaunch.engine.zero.base import OptimizerStrategy, broadcast_model
from dslaunch.engine.zero.common import (
    get_comm,
    named_groups,
    offloads_optimizer,
    repoint_optimizer,
)
from dslaunch.engine.zero.grad_reduce import COMM_BUCKET_CAP, BucketedGradReduce
from dslaunch.engine.zero.offload import cpu_optimizer_for
from dslaunch.engine.zero.offload_pipeline import HostOffload, host_buffer
from dslaunch.engine.zero.param_gather import ParamGather
from dslaunch.engine.zero.zero_init import register_strategy


class _Group:
    """One optimizer param group: its layout, flat buffers and shard tensors."""

    def __init__(self, named, comm, bucket_numel, expert_group=None):
        self.names = [n for n, _ in named]
        self.params = {n: p for n, p in named}
        # the ranks this group is partitioned over: the data-parallel group, or for MoE experts
        # their expert-data-parallel group (engine/parallel/experts.py)
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


class ZeroStage12Strategy(BucketedGradReduce, ParamGather, OptimizerStrategy):
    # in-process recovery (engine/recovery/): a copy of a neighbour's shard
    # (engine/recovery/shard_copies.py, set by the recovery), the updates applied to this shard, and whether
    # an update is between its local step and the end of its all-gather
    copies = None
    version = 0
    updating = False
    host = None  # offload_optimizer: the pipelined copies (offload_pipeline.HostOffload)

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
            self._hook_gradients()  # grad_reduce.py

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
        self._make_grad_buffers()  # grad_reduce.py

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
        self._drop_reductions()  # grad_reduce.py
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

    # -- accounting ----------------------------------------------------------------------------
    def memory_breakdown(self) -> dict:
        """Bytes this rank holds (engine/base/memory.py's format): the flat parameter buffers (plus
        parameters outside the optimizer), the gradient buffers, the fp32 masters and states."""
        params = [g.flat for g in self.groups] + list(self.model.parameters())
        grads = [t for g in self.groups for t in (g.grad_flat, g.grad_shard) if t is not None]
        grads += [p.grad for p in self.model.parameters() if p.grad is not None]
        opt = [g.master for g in self.groups if g.master is not None]
        return breakdown(params, grads, opt + optimizer_state_tensors(self.optimizer))

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        from dslaunch.engine.storage.zero_shards import shard_state_dict

        return shard_state_dict(self)

    def load_state_dict(self, sd, load_optimizer_states: bool = True) -> None:
        from dslaunch.engine.storage.zero_shards import load_shard_state_dict

        if load_optimizer_states:
            load_shard_state_dict(self, sd)
        else:
            self.sync_from_model()
        self.version += 1  # the copies of this shard (shard_copies.py) are stale until exchanged

    def load_resharded(self, ckpt_path: str) -> None:
        """Load a checkpoint written by a job with another world size (automatic reshape)."""
        from dslaunch.engine.storage.zero_shards import load_resharded

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


class Stage1Strategy(ZeroStage12Strategy):
    stage = 1

    def __init__(self, model, optimizer, zero, comm, precision, aio=None):
        super().__init__(1, model, optimizer, zero, comm, precision, aio)


class Stage2Strategy(ZeroStage12Strategy):
    stage = 2

    def __init__(self, model, optimizer, zero, comm, precision, aio=None):
        super().__init__(2, model, optimizer, zero, comm, precision, aio)
