"""ZeRO stage 3: parameters partitioned too (coarse-grained gathering).

Built on the stage 1-2 layout (``stage12.py``): each rank keeps only its chunk of every bucket of
parameters (``local``, in the training dtype; on the CPU with ``offload_param``), plus its fp32
master/optimizer/gradient shards as stage 2 does. The flat parameter buffers exist but their
storage is freed (``untyped_storage().resize_(0)``, the trick FSDP1 uses: parameters and the
tensors autograd saved stay valid views and are refilled in place).

Gathering is coarse: the whole model is all-gathered (one ``all_gather_into_tensor`` per bucket)
when its forward starts and freed when it ends, gathered again when backward reaches the model's
output and freed after the gradients have been reduce-scattered. So at rest a rank holds 16Ψ/N
bytes of model states (the paper's stage 3), but during forward and backward the parameters are
whole, as in stage 2. Per-module gathering with prefetch (``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters``, ``stage3_max_reuse_distance``,
``stage3_param_persistence_threshold``) is not implemented: those keys are accepted and ignored.
"""

from __future__ import annotations

import torch

from dslaunch.engine.zero import partition as P
from dslaunch.engine.zero.stage12 import ZeroStage12Strategy


class Stage3Strategy(ZeroStage12Strategy):
    stage = 3

    def __init__(self, model, optimizer, cfg, comm, precision):
        super().__init__(3, model, optimizer, cfg, comm, precision)
        self.opts.overlap_comm = False
        self._gathered = True
        self.release()
        # kept apart from self._hooks (the stage-2 gradient hooks, whose absence selects the
        # reduce-after-backward path)
        self._module_hooks = [model.register_forward_pre_hook(self._pre_forward),
                              model.register_forward_hook(self._post_forward)]

    # -- partitioned parameters ------------------------------------------------------------------
    def _make_shard(self, g):
        dev = torch.device("cpu") if self.opts.offload_param else self.device
        g.local = torch.cat(g.chunks).to(dev).clone()
        g.chunks = P.shard_chunks(g.local, g.layout)
        super()._make_shard(g)

    def gather(self):
        if self._gathered:
            return
        for g in self.groups:
            st = g.flat.untyped_storage()
            st.resize_(g.flat.numel() * g.flat.element_size())
            for bview, src in zip(g.buckets, g.chunks):
                self.comm.all_gather_into_tensor(bview, src.to(self.device))
        self._gathered = True

    def release(self):
        if not self._gathered:
            return
        for g in self.groups:
            g.flat.untyped_storage().resize_(0)
        self._gathered = False

    def _pre_forward(self, module, args):
        self.gather()

    def _post_forward(self, module, args, output):
        self.release()
        tensors = [output] if torch.is_tensor(output) else [
            t for t in (output.values() if isinstance(output, dict) else
                        output if isinstance(output, (list, tuple)) else []) if torch.is_tensor(t)]
        for t in tensors:
            if t.requires_grad:
                t.register_hook(self._pre_backward)
        return output

    def _pre_backward(self, grad):
        self.gather()
        return grad

    # -- the seam ----------------------------------------------------------------------------------
    def after_backward(self, is_boundary: bool = True):
        super().after_backward(is_boundary)
        self.release()

    on_backward_done = after_backward

    def _all_gather_params(self):
        """After the step the new values only need to reach this rank's local shard."""
        if self.need_master:
            with torch.no_grad():
                for g in self.groups:
                    g.local.copy_(g.master)

    def module_state_dict(self) -> dict:
        was = self._gathered
        self.gather()
        sd = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if not was:
            self.release()
        return sd

    def load_module_state_dict(self, sd: dict, strict: bool = True) -> None:
        was = self._gathered
        self.gather()
        self.model.load_state_dict(sd, strict=strict)
        with torch.no_grad():
            for g in self.groups:
                for dst, src in zip(g.chunks, P.chunk_views(g.flat, g.layout, self.rank)):
                    dst.copy_(src)
        if not was:
            self.release()

    def sync_from_model(self) -> None:
        if self.need_master:
            with torch.no_grad():
                for g in self.groups:
                    g.master.copy_(g.local)

    def memory_breakdown(self) -> dict:
        from dslaunch.engine.memory import breakdown, optimizer_state_tensors

        params = [g.local for g in self.groups] + [g.flat for g in self.groups]
        seen = {id(p) for g in self.groups for p in g.params.values()}
        params += [p for p in self.model.parameters() if id(p) not in seen]
        grads = [g.grad_shard for g in self.groups if g.grad_shard is not None]
        grads += [p.grad for p in self.model.parameters() if p.grad is not None]
        opt = [g.master for g in self.groups if g.master is not None]
        return breakdown(params, grads, opt + optimizer_state_tensors(self.optimizer))
