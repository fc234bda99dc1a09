"""ZeRO stage 0: plain data parallelism with bucketed gradient all-reduce.

Gradients live in one flat fp32 buffer laid out in reverse registration order (roughly the order
backward produces them), cut into buckets of at most ``reduce_bucket_size`` elements.
- fp32: each parameter's ``.grad`` is a view into the buffer, so autograd accumulates micro-steps
  in place and a bucket is all-reduced straight from the buffer (no flatten/unflatten copies).
  With ``overlap_comm`` (off unless the config sets it: DeepSpeed's default is on for stage 3
  only) a post-accumulate-grad hook launches a bucket's async all-reduce as soon as its last
  gradient of the boundary micro-step is ready, in bucket
  order on every rank (as DDP does), so communication overlaps the rest of backward; buckets are
  then capped at DDP's sizes (25 MiB, first 1 MiB) whatever ``reduce_bucket_size`` says.
- bf16 with ``bf16_master_weights_and_grads`` (and bf16 optimizer states): as fp32, in bf16: the
  buffer is bf16 and the optimizer steps the bf16 parameters themselves (no masters at all).
- bf16/fp16: the model's parameters are low precision; the optimizer steps fp32 masters whose
  ``.grad`` are the buffer's views; after each micro-step's backward the low-precision gradients
  are added into the buffer (fp32 accumulation) and dropped; buckets are reduced at the boundary.
Gradients are reduced once per accumulation boundary and averaged over the data-parallel ranks
(``prescale_gradients`` divides by ``gradient_predivide_factor`` before the sum and by
world/factor after, as DeepSpeed does), or summed (``gradient_allreduce_op: "sum"``: no scaling
at all, predivide included, as in DeepSpeed).
"""

from __future__ import annotations

import math

import torch

from dslaunch.engine.base.memory import breakdown, optimizer_state_tensors
from dslaunch.engine.base.step_policy import REPLICATED, GradNorm, all_reduce_sq_norm, loss_scale_of, sum_of_squares
from dslaunch.engine.parallel.experts import ExpertGroups, expert_group
from dslaunch.engine.zero.base import OptimizerStrategy, broadcast_model
from dslaunch.engine.zero.zero_init import register_strategy

# With overlap, buckets are capped as DDP caps them (bucket_cap_mb=25, first bucket 1 MiB), even
# under DeepSpeed's default reduce_bucket_size of 5e8 elements: one 5e8 bucket would only be
# ready when backward is over, so nothing would overlap.
OVERLAP_BUCKET_CAP = 25 * 2**20 // 4
OVERLAP_FIRST_BUCKET_CAP = 2**20 // 4


class _Bucket:
    __slots__ = ("start", "end", "params", "pending", "handle", "expert_group", "comm")

    def __init__(self, start, expert_group=None, comm=None):
        self.start, self.end, self.params, self.pending, self.handle = start, start, [], 0, None
        self.expert_group = expert_group  # MoE: the experts' group name (None: dense)
        self.comm = comm  # where the bucket is all-reduced


class Stage0Strategy(OptimizerStrategy):
    stage = 0

    def __init__(self, model, optimizer, zero, comm, precision, *, prescale_gradients=False,
                 gradient_predivide_factor=1.0):
        """``zero``: the typed ``zero_optimization`` section; the two keywords are the config's
        top-level ``prescale_gradients`` and ``gradient_predivide_factor``."""
        super().__init__(model, optimizer, zero, comm, precision)
        self.bucket_elems = max(1, zero.reduce_bucket_size)
        # fp32 masters unless bf16.bf16_master_weights_and_grads keeps the bf16 weights as such
        uses_masters = precision.mixed and not getattr(precision, "lean", False)
        self.overlap = zero.overlap_comm and not uses_masters
        self.prescale = prescale_gradients
        self.predivide = gradient_predivide_factor or 1.0

        # MoE (engine/parallel/experts.py): expert gradients are all-reduced over their expert-data-parallel
        # group, in buckets of their own, and scaled as the dense ones
        self.experts = ExpertGroups(model, comm)
        broadcast_model(model, comm)
        seen, params = set(), []
        for p in model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        self.params = params
        total = sum(p.numel() for p in params)
        grad_dtype = precision.dtype if precision.mixed and not uses_masters \
            else precision.full_dtype(params)
        self.flat = torch.zeros(total, dtype=grad_dtype, device=params[0].device if params
                                else torch.device("cpu"))
        # layout + buckets in reverse registration order
        self.views, self.buckets, self._bucket_of = {}, [], {}
        offset, bucket = 0, None
        cap = self.bucket_elems
        if self.overlap:
            cap = min(cap, OVERLAP_BUCKET_CAP)
        for p in reversed(params):
            n = p.numel()
            limit = min(cap, OVERLAP_FIRST_BUCKET_CAP) if (self.overlap and
                                                           len(self.buckets) == 1) else cap
            kind = expert_group(p)
            if bucket is None or (bucket.end - bucket.start + n > limit and bucket.params) or \
                    kind != bucket.expert_group:
                bucket = _Bucket(offset, kind, self.experts.comm(kind, comm))
                self.buckets.append(bucket)
            self.views[p] = self.flat[offset:offset + n].view_as(p)
            bucket.params.append(p)
            bucket.end = offset + n
            self._bucket_of[p] = bucket
            offset += n

        if uses_masters:
            self.masters = {}
            for p in params:
                m = p.detach().clone().float().requires_grad_(True)
                m.grad = self.views[p]
                self.masters[p] = m
            self._swap_optimizer_params()
            precision.cast_model(model)
        else:  # the optimizer steps the parameters themselves (fp32, or bf16 when lean)
            self.masters = None
            precision.cast_model(model)
            for p in params:
                p.grad = self.views[p]
        self._sync_now = False
        self._next_launch = 0
        self._hooks = []
        # GatheredParameters(modifier_rank=...) refreshes our masters; dslaunch.utils'
        # safe_get_full_* find the strategy of a parameter there
        register_strategy(self)
        self.rebind_world()

    def rebind_world(self) -> None:
        """Overlapped reduction hooks exist while the group has peers (a replacement rank is built
        alone first, then joins: engine/recovery/)."""
        if self.overlap and self.comm.world_size > 1 and not self._hooks:
            for p in self.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    # -- set-up --------------------------------------------------------------------------------
    def _swap_optimizer_params(self):
        if any(len(s) for s in self.optimizer.state.values()):
            raise RuntimeError("mixed precision: the optimizer already has state; pass a fresh "
                               "optimizer to dslaunch.initialize")
        for group in self.optimizer.param_groups:
            group["params"] = [self.masters.get(p, p) for p in group["params"]]

    # -- backward ------------------------------------------------------------------------------
    def prepare_backward(self, is_boundary: bool) -> None:
        self._sync_now = is_boundary and self.overlap and self.comm.world_size > 1
        if self._sync_now:
            self._next_launch = 0
            for b in self.buckets:
                b.pending = len(b.params)
                b.handle = None

    def _attach(self, p):
        """Make sure ``p.grad`` is our buffer view (a user may have replaced or dropped it)."""
        view = self.views[p]
        g = p.grad
        if g is not None and g.data_ptr() != view.data_ptr():
            view.copy_(g)
            p.grad = view

    def _grad_ready(self, p):
        if not self._sync_now:
            return
        self._attach(p)
        bucket = self._bucket_of[p]
        bucket.pending -= 1
        if bucket.pending == 0:
            # launch in bucket order only, so every rank issues the same sequence
            while (self._next_launch < len(self.buckets)
                   and self.buckets[self._next_launch].pending == 0):
                self._launch(self.buckets[self._next_launch])
                self._next_launch += 1

    def _launch(self, bucket, async_op=True):
        chunk = self.flat[bucket.start:bucket.end]
        if self.prescale and self.predivide != 1.0 and self.average_gradients:
            chunk.mul_(1.0 / self.predivide)
        bucket.handle = bucket.comm.all_reduce(chunk, async_op=async_op)

    def after_backward(self, is_boundary: bool) -> None:
        if self.masters is not None:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        self.views[p].add_(p.grad)
                        p.grad = None
        else:
            for p in self.params:
                self._attach(p)
        if is_boundary:
            self._reduce()
        self._sync_now = False

    def _reduce(self):
        world = self.comm.world_size
        if world == 1:
            return
        if self._sync_now:
            for b in self.buckets[self._next_launch:]:  # unused params: never got a hook call
                self._launch(b)
            for b in self.buckets:
                b.handle.wait()
                b.handle = None
        else:
            for b in self.buckets:
                self._launch(b, async_op=False)
        post = (self.predivide / world) if self.prescale else (1.0 / world)
        if post != 1.0 and self.average_gradients:
            self.flat.mul_(post)

    # -- step (base.OptimizerStrategy.step runs the policy) -------------------------------------
    step_policy = REPLICATED  # a non-finite norm skips in any precision; coef = clip / scale

    def _boundary_grad_norm(self, clip_norm, loss_scaler, fp16: bool) -> GradNorm:
        # always measured: a non-finite norm skips the step in fp32 / bf16 too (step_policy.py)
        if not self.experts:
            scaled = torch.linalg.vector_norm(self.flat).item() if len(self.flat) else 0.0
            return GradNorm.from_scaled(scaled, loss_scale_of(loss_scaler))
        # dense gradients are the same on every rank; an expert's on its replicas only: sum each
        # rank's share of them over the ranks, so every expert counts once
        dense, shared = 0.0, 0.0
        for b in self.buckets:
            sq = sum_of_squares([self.flat[b.start:b.end]])
            if b.expert_group is None:
                dense += sq
            else:
                shared += sq * self.experts.norm_weight(b.expert_group)
        shared, overflow = all_reduce_sq_norm(shared, self.comm.all_reduce)
        scaled = math.sqrt(dense + shared) if math.isfinite(dense) and not overflow else math.inf
        return GradNorm.from_scaled(scaled, loss_scale_of(loss_scaler))

    def _scale_grads_and_step(self, coef: float) -> None:
        if coef != 1.0:
            self.flat.mul_(coef)
        self.optimizer.step()
        self._copy_masters_to_model()

    def _copy_masters_to_model(self):
        if self.masters is not None:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.params],
                                     [self.masters[p] for p in self.params])

    def zero_grad(self) -> None:
        self.flat.zero_()
        for p in self.params:
            if self.masters is not None:
                p.grad = None
            elif p.grad is None or p.grad.data_ptr() != self.views[p].data_ptr():
                p.grad = self.views[p]

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        sd = {"optimizer": self.optimizer.state_dict()}
        if self.masters is not None:
            sd["fp32_masters"] = [self.masters[p].detach() for p in self.params]
        return sd

    def load_state_dict(self, sd: dict, load_optimizer_states: bool = True) -> None:
        if load_optimizer_states:
            self.optimizer.load_state_dict(sd["optimizer"])
            if self.masters is not None and "fp32_masters" in sd:
                saved = sd["fp32_masters"]
                if len(saved) != len(self.params):
                    raise RuntimeError(f"checkpoint holds {len(saved)} fp32 master tensors, the "
                                       f"model has {len(self.params)} trainable parameters")
                with torch.no_grad():
                    for p, m in zip(self.params, saved):
                        self.masters[p].copy_(m)
                        p.data.copy_(m)
                return
        self.sync_from_model()

    def owns(self, param_ids) -> bool:
        return any(id(p) in param_ids for p in self.params)

    def sync_from_model(self) -> None:
        if self.masters is not None:
            with torch.no_grad():
                for p in self.params:
                    self.masters[p].copy_(p.data)

    def memory_breakdown(self) -> dict:
        opt = optimizer_state_tensors(self.optimizer)
        if self.masters is not None:
            opt = list(self.masters.values()) + opt
        grads = [self.flat] + [p.grad for p in self.params if p.grad is not None]
        return breakdown(list(self.model.parameters()), grads, opt)
