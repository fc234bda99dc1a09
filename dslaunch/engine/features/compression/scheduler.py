"""``compression_scheduler``: switches each method on in the compressed layers when the step count
reaches its ``schedule_offset``; once on, a method stays on (DeepSpeed 0.18's scheduler; its
sparse-pruning check also reads ``schedule_offset_end``, which its config keeps for snip_momentum
only, so l1/topk sparse pruning failed there with a KeyError; here they start at the offset). The engine
calls ``step(step_zero_check=True)`` before the first forward and ``step()`` after every optimizer
step.

Weight quantization's bits (MoQ's schedule): from the offset, ``k`` steps in, the bits are
``start_bits`` lowered by one each time ``k`` reaches the period, the period doubling each time
(drops at ``P, 2P, 4P, ...``), never below ``target_bits`` (``scheduled_bits``). With
``quantize_weight_in_forward`` the forward quantizes to those bits; without it ``step()``
quantizes ``weight.data`` in place after each optimizer step (DeepSpeed's MoQ optimizer path).
"""

from __future__ import annotations

import logging

import torch

from dslaunch.config.compression import (
    ACTIVATION_QUANTIZATION,
    CHANNEL_PRUNING,
    HEAD_PRUNING,
    ROW_PRUNING,
    SPARSE_PRUNING,
    WEIGHT_QUANTIZATION,
    parse,
)
from dslaunch.engine.base.log import log_dist
from dslaunch.engine.features.compression.compress import compression_plan, inner_model


def scheduled_bits(start_bits: int, target_bits: int, period: int, steps: int) -> int:
    """The bits ``steps`` optimizer steps after the quantization offset."""
    bits, due = start_bits, period
    while bits > target_bits and steps >= due:
        bits -= 1
        due *= 2
    return bits


_FLAG = {WEIGHT_QUANTIZATION: "weight_quantization_enabled",
         ACTIVATION_QUANTIZATION: "activation_quantization_enabled",
         CHANNEL_PRUNING: "channel_pruning_enabled",
         SPARSE_PRUNING: "sparse_pruning_enabled", ROW_PRUNING: "row_pruning_enabled",
         HEAD_PRUNING: "head_pruning_enabled"}


class compression_scheduler:
    def __init__(self, model, compression_config):
        """``compression_config``: the ``compression_training`` section (or the whole config)."""
        self.model = inner_model(model)
        self.methods = parse(compression_config)
        self.training_steps = 0
        self.weight_quantization_enabled = False
        self.layers = {}  # method -> [layer]
        self.announced = set()
        for method, _, names, _ in compression_plan(self.model, self.methods, verbose=False):
            for name in (n for entry in names for n in entry):
                layer = self.model.get_submodule(name)
                if hasattr(layer, _FLAG[method]):
                    self.layers.setdefault(method, []).append(layer)
        enabled = [m for m, v in self.methods.items() if m in _FLAG and v["shared"]["enabled"]]
        if enabled and not self.layers:
            log_dist("compression_training enables " + ", ".join(enabled) + " but no module of "
                     "the model is compressed: call deepspeed.compression.init_compression(model, "
                     "config) before initialize", ranks=[0], level=logging.WARNING)

    def _on(self, method) -> bool:
        shared = self.methods[method]["shared"]
        return self.training_steps >= shared["schedule_offset"]

    def check_all_modules(self) -> None:
        for method, layers in self.layers.items():
            if not self._on(method):
                continue
            if method not in self.announced:  # once, as DeepSpeed's "... is enabled at step N"
                self.announced.add(method)
                log_dist(f"compression: {method} is enabled at step {self.training_steps} "
                         f"({len(layers)} modules)", ranks=[0])
            for layer in layers:
                setattr(layer, _FLAG[method], True)
            if method == WEIGHT_QUANTIZATION:
                self.weight_quantization_enabled = True
                since = self.training_steps - self.methods[method]["shared"]["schedule_offset"]
                for layer in layers:
                    start, target, period = layer._bits_schedule
                    layer.weight.start_bits = scheduled_bits(start, target, period, since)

    def quantize_weights(self) -> None:
        """MoQ path: the weights of layers not quantizing in forward take their quantized values."""
        if not self.weight_quantization_enabled:
            return
        with torch.no_grad():
            for layer in self.layers.get(WEIGHT_QUANTIZATION, []):
                if not layer.weight_quantization_enabled_in_forward:
                    layer.weight.data.copy_(layer.quantized_weight(layer.weight.detach()))

    def step(self, step_zero_check=False) -> None:
        if not step_zero_check:
            self.training_steps += 1
        self.check_all_modules()
        if not step_zero_check:
            self.quantize_weights()
