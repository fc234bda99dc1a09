"""fp32 / bf16 / fp16 training and the fp16 loss scale.

How mixed precision is done (on CPU and GPU alike), DeepSpeed's way rather than autocast:
the model's floating-point parameters and buffers are cast to bf16/fp16, so forward and backward
run in the low precision and the parameters take half the memory; the optimizer steps fp32
*master* copies of the parameters that the ZeRO strategy owns (the strategy accumulates gradients
in fp32 and copies the updated masters back into the low-precision parameters after each step).
Why not autocast with fp32 parameters: autocast on CPU covers only some ops (matmul/linear), keeps
fp32 weights and re-casts them at every call, so it saves no parameter memory and little time;
casting the model once gives the ZeRO paper's 2-byte parameters and gradients that the memory
accounting (``engine.memory_breakdown()``) and the ZeRO stages rely on. Losses the model returns
in fp32 (the example GPT computes cross-entropy in fp32) stay fp32.

Memory-lean bf16 (``bf16.bf16_master_weights_and_grads``, DeepSpeed's key): the masters and the
gradients the optimizer sees stay bf16, so no fp32 copy of the weights exists (``lean``); with
``bf16_optimizer_states`` the optimizer states are bf16 too, else they stay fp32 in the CPU Adam
of ``offload_optimizer: cpu`` (the config refuses the other combinations, as DeepSpeed does).

Loss scaling (fp16 only, as DeepSpeed documents): ``fp16.loss_scale`` > 0 is a static scale;
0 means dynamic: start at ``2**initial_scale_power``; on an overflow the step is skipped and,
once ``hysteresis`` overflows have been seen, the scale is divided by 2 (never below
``min_loss_scale``); after ``loss_scale_window`` steps without overflow it is multiplied by 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """No scaling (fp32, bf16) or a static scale."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update(self, overflow: bool) -> None:
        pass

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, sd: dict) -> None:
        self.cur_scale = float(sd["cur_scale"])


class DynamicLossScaler(LossScaler):
    """DeepSpeed's dynamic loss scale with hysteresis (same state machine, same counters)."""

    dynamic = True

    def __init__(self, init_scale: float = 2.0**16, scale_window: int = 1000,
                 min_scale: float = 1.0, hysteresis: int = 2,
                 consecutive_hysteresis: bool = False, scale_factor: float = 2.0):
        super().__init__(init_scale)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(hysteresis)
        self.cur_hysteresis = int(hysteresis)
        self.consecutive_hysteresis = consecutive_hysteresis
        self.scale_factor = scale_factor
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale, "cur_iter": self.cur_iter,
                "last_overflow_iter": self.last_overflow_iter,
                "cur_hysteresis": self.cur_hysteresis}

    def load_state_dict(self, sd: dict) -> None:
        self.cur_scale = float(sd["cur_scale"])
        self.cur_iter = int(sd.get("cur_iter", 0))
        self.last_overflow_iter = int(sd.get("last_overflow_iter", -1))
        self.cur_hysteresis = int(sd.get("cur_hysteresis", self.delayed_shift))


@dataclass
class Precision:
    """What the engine and the ZeRO strategies need to know about the training precision."""

    name: str  # "fp32" | "bf16" | "fp16"
    scaler: LossScaler
    # bf16.bf16_master_weights_and_grads: the optimizer steps bf16 masters (the bf16 weights
    # themselves unless offloaded) with bf16 gradients instead of fp32 copies
    master_dtype: torch.dtype = torch.float32
    # bf16.bf16_optimizer_states: the optimizer states are bf16 too (else the CPU Adam keeps them
    # fp32 for the bf16 masters)
    fp32_optimizer_states: bool = True

    @property
    def lean(self) -> bool:
        """Masters in the training dtype: no fp32 copy of the weights exists."""
        return self.mixed and self.master_dtype == self.dtype

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    @property
    def mixed(self) -> bool:
        """True when the model runs in low precision and the optimizer steps fp32 masters."""
        return self.name != "fp32"

    def full_dtype(self, params) -> torch.dtype:
        """The dtype full precision trains in: float64 when every parameter is float64 (the
        numerical proofs), else fp32. Gradient buffers, shards and masters follow it."""
        params = list(params)
        if not self.mixed and params and all(p.dtype == torch.float64 for p in params):
            return torch.float64
        return torch.float32

    def cast_model(self, model: torch.nn.Module) -> None:
        """Cast floating-point parameters and buffers to the training dtype (in place)."""
        if self.mixed:
            model.to(self.dtype)

    def cast_inputs(self, value):
        """Floating-point tensors in (nested) inputs -> the training dtype; others unchanged."""
        if not self.mixed:
            return value
        if isinstance(value, torch.Tensor):
            return value.to(self.dtype) if value.is_floating_point() else value
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast_inputs(v) for v in value)
        if isinstance(value, dict):
            return {k: self.cast_inputs(v) for k, v in value.items()}
        return value


def build_precision(fp16, bf16) -> Precision:
    """From the config's ``fp16`` and ``bf16`` sections (typed, dslaunch.config.sections)."""
    if fp16.enabled:
        if fp16.loss_scale > 0:
            return Precision("fp16", LossScaler(float(fp16.loss_scale)))
        return Precision("fp16", DynamicLossScaler(
            init_scale=2.0 ** fp16.initial_scale_power, scale_window=fp16.loss_scale_window,
            min_scale=fp16.min_loss_scale, hysteresis=fp16.hysteresis,
            consecutive_hysteresis=fp16.consecutive_hysteresis))
    if bf16.enabled:
        if bf16.bf16_master_weights_and_grads:
            return Precision("bf16", LossScaler(1.0), master_dtype=torch.bfloat16,
                             fp32_optimizer_states=not bf16.bf16_optimizer_states)
        return Precision("bf16", LossScaler(1.0))
    return Precision("fp32", LossScaler(1.0))
