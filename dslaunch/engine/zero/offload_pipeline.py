"""ZeRO-Offload's data path between the accelerator and the host (stages 1-2, ``offload_optimizer:
cpu``), built so that the copies hide behind compute:

- gradients: each reduced bucket's chunk goes to the host as soon as backward produces it, on a
  side stream (device-to-host, into the pinned fp32 gradient shard), while backward goes on. The
  first write of a bucket after ``zero_grad`` is a plain copy (converted to fp32 and averaged on
  the device, so the host does no pass at all); later micro-steps of an accumulation land in a
  pinned scratch buffer and are added on the host when backward ends (``drain``);
- the step: the compiled CPU optimizer updates the fp32 master chunk by chunk on all the rank's
  cores, scaling the gradient (clip and loss scale) and writing the 16-bit copy of the updated
  weights in the same pass (``copy_out``); each chunk's host-to-device copy is queued on another
  side stream as soon as its update is done, so the copies overlap the update of the next chunks.

Streams and events come from the accelerator interface: on a CPU host they are the no-op
``NullStream``/``NullEvent`` and every copy is done when it is queued, so the same code runs (and is
tested) without a GPU. Host buffers are pinned only where an accelerator can use that.
"""

from __future__ import annotations

import os

import torch

from dslaunch.accelerator import get_accelerator
from dslaunch.engine.base import partition as P
from dslaunch.engine.optim.cpu_adam import CPUOptimizer
from dslaunch.engine.zero.common import BufferPool


def optimizer_threads() -> int:
    """Threads for the offloaded step: this rank's share of the cores it may run on (the step is
    the only work on the host then), never fewer than torch's own setting."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(torch.get_num_threads(), cores // local)


def host_buffer(numel: int, dtype, pin: bool) -> torch.Tensor:
    t = torch.zeros(numel, dtype=dtype, device="cpu")
    return t.pin_memory() if pin else t


class HostOffload:
    """The copies of one strategy's offloaded groups (``stage12.ZeroStage12Strategy``)."""

    def __init__(self, strategy, pin: bool):
        self.strategy = strategy
        self.pin = pin
        acc = get_accelerator() if strategy.device.type != "cpu" else None
        self.acc = acc
        self.to_host = acc.Stream() if acc is not None else None
        self.to_device = acc.Stream() if acc is not None else None
        self.written: set = set()  # (group, bucket) whose gradient chunk was written since zero_grad
        # each bucket's gradient norm taken on the device as it was copied (valid while the
        # bucket was written once: no accumulation), so the host makes no pass for clipping
        self.norms: dict = {}
        self.pending: list = []  # (device tensor kept alive, event, host scratch, destination)
        self.uploads: list = []  # events of the last step's host-to-device copies
        self.scratch_pool = BufferPool()  # pinned host buffers for accumulated micro-steps
        # the 16-bit copy the CPU optimizer writes, to go up to the device; none where the
        # model's chunks are on the host (the optimizer writes them directly) or the model trains
        # in fp32 (the masters themselves go up)
        self.lp = [host_buffer(g.layout.shard_numel, strategy.dtype, pin)
                   if self._on_device(g) and strategy.dtype != g.master.dtype else None
                   for g in strategy.groups]

    @staticmethod
    def _on_device(g) -> bool:
        return any(c.device.type != "cpu" for c in g.chunks)

    # -- gradients ------------------------------------------------------------------------------
    def gradient(self, gi: int, bi: int, out: torch.Tensor, post: float) -> None:
        """Bucket ``bi`` of group ``gi`` was reduced into ``out`` (this rank's chunk, on the
        device): add ``post * out`` to the host gradient shard, asynchronously."""
        g = self.strategy.groups[gi]
        off = g.layout.shard_offsets()[bi]
        dst = g.grad_shard[off: off + out.numel()]
        fresh = (gi, bi) not in self.written
        self.written.add((gi, bi))
        if self.to_host is None:  # a CPU host: the chunk is here already
            if fresh:
                dst.copy_(out.to(dst.dtype).mul_(post) if post != 1.0 else out)
            else:
                dst.add_(out.to(dst.dtype), alpha=post)
            return
        self.to_host.wait_stream(self.acc.current_stream())
        with self.acc.stream(self.to_host):
            wide = out.to(dst.dtype)
            if post != 1.0:
                wide = wide.mul_(post) if wide is not out else wide * post
            scratch = None
            if fresh:
                dst.copy_(wide, non_blocking=True)
                self.norms[(gi, bi)] = torch.linalg.vector_norm(wide, dtype=torch.float32)
            else:
                self.norms.pop((gi, bi), None)
                scratch = self.scratch_pool.take(
                    wide.numel(), lambda n: host_buffer(n, dst.dtype, self.pin))
                scratch.copy_(wide, non_blocking=True)
            event = self.acc.Event()
            event.record(self.to_host)
        # ``out`` and ``wide`` were made on other streams: keep them until the copy is done
        self.pending.append(((out, wide), event, scratch, dst))

    def drain(self) -> None:
        """Wait for the gradient copies; add the accumulated ones on the host."""
        for _keep, event, scratch, dst in self.pending:
            event.synchronize()
            if scratch is not None:
                dst.add_(scratch)
                self.scratch_pool.give(scratch)
        self.pending = []

    def zero_grad(self) -> None:
        """The next write of every bucket is a copy: the shards need no zeroing pass."""
        self.drain()
        self.written.clear()
        self.norms.clear()

    def zero_unwritten(self) -> None:
        """Zero the gradient chunks no backward wrote since ``zero_grad`` (a step without a
        backward steps on zero gradients, as with shards zeroed by zero_grad)."""
        for gi, g in enumerate(self.strategy.groups):
            for bi, chunk in enumerate(P.shard_chunks(g.grad_shard, g.layout)):
                if (gi, bi) not in self.written:
                    chunk.zero_()
                    self.written.add((gi, bi))

    def sum_of_squares(self):
        """The shards' sum of squared gradient norms from the norms taken on the device, as
        ``step_policy.sum_of_squares`` sums them; None where a bucket has none (accumulated,
        or a CPU host, where the host takes them)."""
        n_buckets = sum(len(g.layout.buckets) for g in self.strategy.groups)
        if not self.norms or len(self.norms) != n_buckets:
            return None
        norms = torch.stack([self.norms[k] for k in sorted(self.norms)]).cpu().tolist()
        return sum(x * x for x in norms)

    # -- the step -------------------------------------------------------------------------------
    @staticmethod
    def fuses(optimizer) -> bool:
        """Whether the optimizer can step with the fused scale + copy-out (dslaunch's compiled
        CPU optimizers stepping resident masters)."""
        return isinstance(optimizer, CPUOptimizer) and not getattr(optimizer, "swap_params", False)

    def step(self, coef: float) -> None:
        """One optimizer step over every chunk: gradients scaled by ``coef`` inside the update,
        the updated 16-bit chunk written on the host and copied into this rank's chunk of the
        device's flat buffer as soon as it is ready."""
        s = self.strategy
        for event in self.uploads:  # the 16-bit host buffers are about to be rewritten
            event.synchronize()
        self.uploads = []
        copy_outs, targets = {}, {}
        for g, lp in zip(s.groups, self.lp):
            lp_chunks = P.shard_chunks(lp, g.layout) if lp is not None else [None] * len(g.chunks)
            grad_chunks = P.shard_chunks(g.grad_shard, g.layout)
            for sp, gc, lpc, dev in zip(g.shard_params, grad_chunks, lp_chunks, g.chunks):
                sp.grad = gc
                if dev.device.type == "cpu":  # the model's chunk is here: written in the pass
                    copy_outs[sp] = dev
                elif lpc is not None:
                    copy_outs[sp] = lpc
                    targets[sp] = (lpc, dev)
                else:  # fp32 model: the master goes up
                    targets[sp] = (sp.detach(), dev)
        if self.to_device is not None:
            self.to_device.wait_stream(self.acc.current_stream())

        def upload(sp):
            if sp not in targets:
                return
            src, dev = targets[sp]
            if self.to_device is None:
                dev.copy_(src)
                return
            with self.acc.stream(self.to_device):
                dev.copy_(src, non_blocking=True)
                event = self.acc.Event()
                event.record(self.to_device)
            self.uploads.append(event)

        s.optimizer.step(grad_scale=coef, copy_outs=copy_outs, on_updated=upload,
                         threads=optimizer_threads())
        for g in s.groups:
            for sp in g.shard_params:
                sp.grad = None
        if self.to_device is not None:  # the flat buffers are read next on the compute stream
            self.acc.current_stream().wait_stream(self.to_device)

    def abandon(self) -> None:
        """In-process recovery: let the copies in flight end, forget them."""
        self.drain()
        for event in self.uploads:
            event.synchronize()
        self.uploads = []
        self.written.clear()
        self.norms.clear()
