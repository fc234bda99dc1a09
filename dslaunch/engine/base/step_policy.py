"""The one overflow / clip / step policy of the optimizer strategies and the pipeline.

At an accumulation boundary every path runs the same decision:

1. the caller supplies the gradient norm (``GradNorm``), computed from its own tensors: stage 0's
   flat buffer, the ZeRO 1-3 shards (squared norms all-reduced), the 1-bit optimizers' local norms,
   the pipeline's whole-world sum (``pipe/grad_norm.py``);
2. a non-finite norm skips the step, in every precision (fp16, bf16, fp32) and on every path
   (stage 0, ZeRO 1-3, the pipeline, 1-bit; on a 1-bit optimizer's local step, whose norm is
   agreed between ranks only with clipping or fp16, on the ranks that see it): the weights and
   optimizer states stay as they were, the loss scaler is told (a dynamic one lowers its scale),
   no norm is recorded, and the engine counts the step in ``skipped_steps`` and leaves the lr
   scheduler alone. This is DeepSpeed 0.19's
   ``DeepSpeedZeroOptimizer.step`` (stage_1_and_2.py: ``check_overflow`` -> ``self.overflow`` ->
   zero the gradients and return) with ``engine._take_model_step``'s ``skipped_steps += 1``: the
   path DeepSpeed takes under fp16 at every stage and under bf16 at ZeRO 1-2 (its
   ``bf16.check_grad_overflow`` defaults to true). DeepSpeed itself is not one behaviour: in fp32
   (any stage), bf16 at ZeRO 3 (``_overflow_check_and_loss_scale_update`` checks fp16 only) and
   bf16 at stage 0 (``FP16_Optimizer`` sets ``overflow`` but steps when not scaling) it steps with
   the NaN and the weights become NaN; ``BF16_Optimizer`` (bf16 + fp32 accumulation at ZeRO 1,
   bf16 pipelines) fails ``assert all_groups_norm > 0``. dslaunch skips everywhere instead
   (``tests/test_nonfinite_grad_skip.py``), whether gradient clipping is on or off;
3. otherwise the unscaled norm is recorded and the caller gets the coefficient to multiply the
   gradients by: torch's clip factor with ``1 / loss_scale`` folded in;
4. after the optimizer step the caller calls ``stepped`` (the scaler counts a good step).

The paths differ in one way, kept as it was (same arithmetic, bit for bit) and named here:

- how ``1 / loss_scale`` is folded: ``clip / scale`` (stage 0, 1-bit) or ``clip * (1 / scale)``
  (ZeRO 1-3): equal for power-of-2 scales, not always for a static scale like 1000; the pipeline
  applies the clip factor alone and the strategy's own step then unscales (stage 1-2 gradients are
  low precision there, so folding would round differently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

# how 1 / loss_scale is folded into the coefficient (see the module docstring)
DIVIDE = "clip / scale"
TIMES_INVERSE = "clip * (1 / scale)"
CLIP_ONLY = "clip only (the strategy unscales)"


def clipping_on(clip_norm) -> bool:
    return bool(clip_norm) and clip_norm > 0


def clip_coefficient(norm: float, clip_norm) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), at most 1; 1 when
    clipping is off or the norm is not finite."""
    if not clipping_on(clip_norm) or not math.isfinite(norm):
        return 1.0
    return min(1.0, float(clip_norm) / (norm + 1e-6))


def loss_scale_of(loss_scaler) -> float:
    """The current loss scale (1 without a scaler: strategies built outside the engine)."""
    return 1.0 if loss_scaler is None else float(loss_scaler.loss_scale)


def sum_of_squares(tensors: Iterable[torch.Tensor]) -> float:
    """Sum of the tensors' squared norms, each norm taken in fp32 (fp64 tensors in fp64), summed
    in a Python float (fp64) so that many small pieces lose nothing."""
    sq = 0.0
    for t in tensors:
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        sq += float(torch.linalg.vector_norm(t, dtype=wide)) ** 2
    return sq


def all_reduce_sq_norm(sq: float, all_reduce: Callable) -> tuple:
    """(global sum of squares, overflow anywhere) from this rank's ``sq`` with one fp64
    all-reduce of [sq, flag]: a rank with a non-finite sum sends 0 and raises the flag, so every
    rank takes the same decision."""
    finite = math.isfinite(sq)
    buf = torch.tensor([sq if finite else 0.0, 0.0 if finite else 1.0], dtype=torch.float64)
    all_reduce(buf)
    return float(buf[0]), bool(buf[1] > 0)


@dataclass(frozen=True)
class GradNorm:
    """What a caller measured: the unscaled global norm (None: not computed, nothing needs it) and
    whether a non-finite value was seen."""

    value: Optional[float] = None
    overflow: bool = False

    @classmethod
    def from_scaled(cls, scaled_norm: float, loss_scale: float) -> "GradNorm":
        """From a norm of the still loss-scaled gradients."""
        return cls(scaled_norm / loss_scale, not math.isfinite(scaled_norm))


@dataclass(frozen=True)
class StepDecision:
    skip: bool  # overflow: leave the weights alone (the scaler was told)
    grad_norm: Optional[float]  # what ``grad_norm()`` reports for this step
    coef: float = 1.0  # multiply the gradients by this before the optimizer step (1: leave them)


@dataclass(frozen=True)
class StepPolicy:
    unscale: str  # DIVIDE, TIMES_INVERSE or CLIP_ONLY

    def needs_norm(self, clip_norm, fp16: bool) -> bool:
        """Whether a caller whose norm costs a collective of its own should pay it: only the
        1-bit optimizers' local steps ask (onebit/strategy.py; their byte accounting books no
        other collective), and there only clipping and fp16 make them agree on one norm, so a
        NaN on such a step skips on the ranks that see it. Every other path measures the norm
        at every boundary, in every precision, for the non-finite check."""
        return clipping_on(clip_norm) or fp16

    def decide(self, norm: GradNorm, clip_norm, loss_scaler, fp16: bool = False) -> StepDecision:
        """Skip (telling the loss scaler of the overflow here) or the coefficient to apply. A
        non-finite norm skips in any precision (``fp16`` is kept for the callers' signature)."""
        if norm.overflow:
            if loss_scaler is not None:
                loss_scaler.update(True)
            return StepDecision(skip=True, grad_norm=None)
        clip = 1.0 if norm.value is None else clip_coefficient(norm.value, clip_norm)
        return StepDecision(skip=False, grad_norm=norm.value,
                            coef=self._fold_unscale(clip, loss_scale_of(loss_scaler)))

    def _fold_unscale(self, clip: float, scale: float) -> float:
        if self.unscale == DIVIDE:
            return clip / scale
        if self.unscale == TIMES_INVERSE:
            return clip * (1.0 / scale)
        if self.unscale == CLIP_ONLY:
            return clip
        raise ValueError(f"StepPolicy.unscale: {self.unscale!r}")

    @staticmethod
    def stepped(loss_scaler) -> None:
        """The optimizer stepped: the scaler counts one more step without overflow."""
        if loss_scaler is not None:
            loss_scaler.update(False)


# stage 0 and the 1-bit optimizers: every rank holds the whole (reduced) gradients
REPLICATED = StepPolicy(unscale=DIVIDE)
# ZeRO 1-3: each rank holds a shard; the squared norms are all-reduced
SHARDED = StepPolicy(unscale=TIMES_INVERSE)
# pipeline / tensor parallel: the whole world's norm decides; the strategy then steps unclipped
MODEL_PARALLEL = StepPolicy(unscale=CLIP_ONLY)
