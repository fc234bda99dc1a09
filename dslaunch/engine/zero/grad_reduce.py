"""The gradient side of ZeRO stages 1 and 2, a mix-in of ``stage12.ZeroStage12Strategy``: gradients
into this rank's shards, bucket by bucket (stage 3 reuses the staging pool and the dtype choice).

- stage 1: gradients accumulate whole (``p.grad`` are views of a flat gradient buffer laid out like
  the parameters) and are reduce-scattered at the accumulation boundary, one collective per bucket
  (on gloo that runs as an in-place all_reduce, ``engine/comm/collectives.py``: from the boundary until
  ``zero_grad`` the ``p.grad`` views then hold the sum over ranks, not this rank's gradients);
- stage 2: every micro-step, gradients are copied bucket by bucket into a reused staging buffer
  (and freed), reduce-scattered, and this rank's chunk is added to its gradient shard: the only
  gradient memory that lasts is the shard, and accumulation over micro-steps is exact. A
  post-accumulate hook per parameter stages gradients as they appear; a full bucket is
  reduce-scattered right there, synchronously with ``overlap_comm: false``, else asynchronously
  with at most ``IN_FLIGHT_BUCKETS`` in flight (our default for stage 2; DeepSpeed's is off);
- buckets hold at most ``reduce_bucket_size`` elements, capped at ``COMM_BUCKET_CAP`` (see there);
- with ``offload_optimizer`` the reduced chunks go to the host (``offload_pipeline.HostOffload``).

The mix-in reads what the strategy sets up (``stage12.py``): ``groups`` (each with ``layout``,
``params``, ``flat``, ``comm``, ``world``, ``grad_flat`` / ``grad_shard``, ``bucket_of``,
``slot_of``), ``stage``, ``dtype``, ``device``, ``world``, ``overlap_comm``,
``average_gradients``, ``host`` and ``_hooks``.
"""

from __future__ import annotations

import atexit
import weakref

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.base.autocast import comm_dtype
from dslaunch.engine.zero.common import BufferPool

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


class BucketedGradReduce:
    """Stages 1-2's gradient reduction (the module's docstring), mixed into the strategy."""

    most_in_flight = 0  # the most overlapped reduce-scatters seen in flight at once (a check)

    def _hook_gradients(self) -> None:
        """Stage 2: a post-accumulate hook per parameter. A bucket is reduced as soon as its
        gradients exist (at most IN_FLIGHT_BUCKETS still in flight with overlap_comm), so whole
        gradients never exist for the whole model: that is stage 2's memory saving during
        backward, not only after it."""
        for gi, g in enumerate(self.groups if self.stage == 2 else []):
            for name, p in g.params.items():
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    self._make_hook(gi, name)))
        # Gradient hooks still registered when the interpreter finalises can abort the
        # process (seen with async gloo work in flight earlier): drop them at exit.
        atexit.register(_remove_hooks_at_exit, weakref.ref(self))

    def _make_grad_buffers(self) -> None:
        """Stage 1: the flat gradient buffer the ``p.grad`` views live in; stage 2: the staging
        pool and the bookkeeping of the buckets staged and in flight."""
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

    def _drop_reductions(self) -> None:
        """In-process recovery: forget the interrupted step's reductions in flight."""
        self._stage1_grad_chunks = None
        if self.stage >= 2:
            self._in_flight, self._open, self._written = [], {}, {}
            self._reset_pending()

    def _attach_grad_views(self, g) -> None:
        """Stage 1: every ``p.grad`` of group ``g`` a view of its flat gradient buffer."""
        for b, bview in zip(g.layout.buckets, P.bucket_views(g.grad_flat, g.layout)):
            for s in b.slots:
                g.params[s.name].grad = bview[s.start: s.start + s.numel].view(s.shape)

    # -- stage 2: bucketed reduce-scatter driven by gradient hooks -----------------------------
    def _reset_pending(self):
        self._pending = {(gi, bi): len(b.slots) for gi, g in enumerate(self.groups)
                         for bi, b in enumerate(g.layout.buckets)}
        self._order = sorted(self._pending)  # every rank launches buckets in this order
        self._next = 0

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
        (``engine/base/autocast.py``)."""
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

    def remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _remove_hooks_at_exit(ref):
    strategy = ref()
    if strategy is not None:
        strategy.remove_hooks()
