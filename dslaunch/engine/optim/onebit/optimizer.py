"""The shared base of the 1-bit optimizers (``OneBitOptimizer``) and their option checks.

``OneBitAdam`` (Tang et al. 2021), ``ZeroOneAdam`` (Lu et al. 2022) and ``OneBitLamb`` (Li et al.
2021) extend it in ``adam.py``, ``zero_one_adam.py`` and ``lamb.py``. All three:

- run on the data-parallel group the engine hands them (``attach_comm``), with the
  ``strategy.py`` optimizer strategy, which all-reduces gradients in full precision only
  on the steps where the optimizer asks for it (``wants_grad_allreduce()``); on the other steps the
  optimizer communicates compressed tensors itself through one
  ``compressed.CompressedAllReduce`` over all its parameters (one call per step; for
  1-bit Adam and 0/1 Adam each parameter is a segment with scales of its own, for 1-bit LAMB
  the momenta are one buffer, see ``per_parameter_scales``);
- keep their per-rank error-feedback buffers and stage counters in ``state_dict()`` (key
  ``"onebit"``), so a checkpoint resumes the compression stage where it stopped;
- treat a parameter whose ``.grad`` is None as having a zero gradient (every rank must
  communicate the same layout; the engine's strategy always gives every parameter a gradient).

``comm_backend_name``: the compression runs over the torch.distributed group the job already has
(gloo on CPU, NCCL on GPU), so ``"nccl"`` and ``"gloo"`` (and None) are accepted whatever the
actual backend is; DeepSpeed's ``"mpi"``, ``"hccl"`` and ``"compressed"`` backends are not
provided and are refused, as is ``cuda_aware: true`` (it only means something for MPI).
"""

from __future__ import annotations

import math

import torch

from dslaunch.config.resolve import ONE_BIT as ONE_BIT_TYPES  # the config's list of their names
from dslaunch.engine.optim.onebit.compressed import CompressedAllReduce


def clamp_torch(m: torch.Tensor, denom: torch.Tensor, bound: float) -> torch.Tensor:
    """``OneBitOptimizer.clamp_to_adam`` with torch ops (what the compiled op must equal)."""
    lim = denom * bound
    torch.maximum(torch.minimum(m, lim, out=m), lim.neg_(), out=m)
    return m.masked_fill_(torch.isinf(denom), 0.0)


def _clamp_op(m: torch.Tensor, denom: torch.Tensor):
    """The compiled op for ``clamp_to_adam`` when these tensors suit it, else None."""
    if (m.device.type != "cpu" or m.dtype != torch.float32 or denom.dtype != torch.float32
            or not m.is_contiguous() or not denom.is_contiguous()
            or m.numel() != denom.numel()):
        return None
    from dslaunch.kernels import load_op

    return load_op("onebit_pack")


_BACKENDS_OK = (None, "nccl", "gloo")


def check_comm_options(name: str, cuda_aware, comm_backend_name) -> None:
    if comm_backend_name not in _BACKENDS_OK:
        raise ValueError(
            f"optimizer.params.comm_backend_name: {comm_backend_name!r} is not supported by "
            f"{name}; dslaunch compresses over the job's torch.distributed group (gloo on CPU, "
            "NCCL on GPU): use \"nccl\" or \"gloo\" (or leave it out)")
    if cuda_aware:
        raise ValueError(f"optimizer.params.cuda_aware: true is only meaningful with DeepSpeed's "
                         f"MPI backend, which {name} here does not use; leave it false")


class OneBitOptimizer(torch.optim.Optimizer):
    """Base: step counter, the compressed all-reduce over all parameters, state."""

    algorithm = "1-bit"
    # Compress each parameter with scales of its own (1-bit Adam, 0/1 Adam: DeepSpeed compresses
    # them parameter by parameter), or all of them as one buffer (1-bit LAMB: DeepSpeed fuses its
    # momenta into one buffer after scaling every tensor to a common magnitude).
    per_parameter_scales = True

    def __init__(self, params, defaults: dict, cuda_aware=False, comm_backend_name=None):
        check_comm_options(type(self).__name__, cuda_aware, comm_backend_name)
        super().__init__(params, defaults)
        self.cuda_aware = bool(cuda_aware)
        self.comm_backend_name = comm_backend_name
        self.comm = None
        self.onebit_step = 0  # optimizer steps applied so far
        self._compressor: CompressedAllReduce | None = None
        self._pending_errors: dict | None = None

    # -- wiring ----------------------------------------------------------------------------------
    def attach_comm(self, comm) -> None:
        """The engine's data-parallel ``Comm`` (accounting included)."""
        self.comm = comm
        self._compressor = None

    @property
    def world_size(self) -> int:
        if self.comm is not None:
            return self.comm.world_size
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else 1

    def all_params(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def wants_grad_allreduce(self) -> bool:
        """Whether the gradients of the coming step must arrive averaged in full precision."""
        raise NotImplementedError

    def in_compression_stage(self) -> bool:
        raise NotImplementedError

    # -- compressed communication ------------------------------------------------------------------
    @property
    def compressor(self) -> CompressedAllReduce:
        if self._compressor is None:
            params = self.all_params()
            numel = sum(p.numel() for p in params)
            segments = [p.numel() for p in params] if self.per_parameter_scales else None
            self._compressor = CompressedAllReduce(numel, device=params[0].device, comm=self.comm,
                                                   segments=segments)
            if self._pending_errors is not None:
                self._compressor.load_state_dict(self._pending_errors)
                self._pending_errors = None
        return self._compressor

    def compressed_average(self, tensors: list) -> None:
        """Replace ``tensors`` (one per parameter, in ``all_params()`` order) by their 1-bit
        error-compensated average over the data-parallel ranks (in place, one collective pair)."""
        if self.world_size == 1:
            return
        comp = self.compressor
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        comp(flat)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    def compressed_average_flat(self, flat: torch.Tensor) -> None:
        """Replace ``flat`` (fp32, contiguous, all parameters in ``all_params()`` order) by its
        1-bit average over the ranks, in place: no copy in or out."""
        if self.world_size > 1:
            self.compressor(flat)

    def reset_errors(self) -> None:
        if self._compressor is not None:
            self._compressor.reset_errors()
        self._pending_errors = None

    @staticmethod
    def mask_unseen(t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One bit cannot say zero: a coordinate that never had a gradient (variance exactly 0,
        e.g. the embedding rows of tokens absent from the data) comes back from the compressed
        all-reduce as +-scale, and ``scale / (sqrt(0) + eps)`` throws it ~1e4 away per step.
        Keep it at 0 there, which is what Adam does for such a coordinate (DeepSpeed asks the
        user for an ``exp_avg_mask`` instead)."""
        return t.masked_fill_(v == 0, 0.0)

    @staticmethod
    def adam_bound(beta1: float, beta2: float) -> float:
        """The largest per-coordinate step exact Adam can take, in units of lr:
        (1 - beta1) / sqrt(1 - beta2) (3.16 for 0.9 / 0.999)."""
        return (1 - beta1) / math.sqrt(1 - beta2)

    @staticmethod
    def clamp_to_adam(m: torch.Tensor, denom: torch.Tensor, bound: float) -> torch.Tensor:
        """Clamp a decompressed momentum so that ``|m / denom| <= bound``, and zero it where
        ``denom`` is +inf (1-bit Adam's mark for a coordinate that never had a gradient). One
        scale per block gives every coordinate of the block the block's magnitude; a coordinate
        with a small (frozen) variance, e.g. the embedding row of a rare token, then steps by
        ``block_rms / sqrt(v)``, hundreds of times what Adam could, and the run diverges (seen:
        NaN after 15 compressed steps). Error feedback still corrects the direction over time;
        this only keeps each step within what exact Adam could do. One pass with the compiled
        op ``onebit_pack`` (CPU, fp32, contiguous), else torch."""
        op = _clamp_op(m, denom)
        if op is not None:
            op.clamp(m.data_ptr(), denom.data_ptr(), m.numel(), float(bound),
                     torch.get_num_threads())
            return m
        return clamp_torch(m, denom, bound)

    @staticmethod
    def grad_of(p: torch.Tensor) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)

    # -- state -----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        """Optimizer-wide counters of the subclass (plain Python values)."""
        return {}

    def load_extra_state(self, extra: dict) -> None:
        pass

    def state_dict(self) -> dict:
        sd = super().state_dict()
        errors = (self._compressor.state_dict() if self._compressor is not None
                  else self._pending_errors)
        sd["onebit"] = {"algorithm": type(self).__name__, "step": self.onebit_step,
                        "extra": self.extra_state(), "errors": errors}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        extra = sd.pop("onebit", None)
        super().load_state_dict(sd)
        if extra is None:
            return
        if extra.get("algorithm") not in (None, type(self).__name__):
            raise ValueError(f"optimizer state was saved by {extra['algorithm']}, this is "
                             f"{type(self).__name__}")
        self.onebit_step = int(extra.get("step", 0))
        self.load_extra_state(dict(extra.get("extra") or {}))
        errors = extra.get("errors")
        if errors is not None:
            if self._compressor is not None:
                self._compressor.load_state_dict(errors)
            else:
                self._pending_errors = errors
        else:
            self.reset_errors()


def is_onebit(optimizer) -> bool:
    return isinstance(optimizer, OneBitOptimizer)


__all__ = ["ONE_BIT_TYPES", "OneBitOptimizer", "clamp_torch", "check_comm_options", "is_onebit"]
