"""The learning rate over consumed layer tokens (``random_ltd.layer_token_lr_schedule``).

Random-LTD makes a step cheaper as fewer tokens pass the dropping layers, so its paper schedules
the learning rate by layer tokens rather than steps: a warmup over ``warmup_layer_tokens``, then
a linear decay to 0 at ``total_layer_tokens``. DeepSpeed 0.19.8 has the keys but refuses them
("Work In Progress"); this is dslaunch's schedule, driven by the scheduler's
``consumed_layer_tokens``. ``warmup_type`` ``linear``: the fraction of the warmup tokens
consumed; ``log``: ``log(1 + t) / log(1 + warmup)``, DeepSpeed's WarmupLR shape.
"""

from __future__ import annotations

import math

from dslaunch.engine.features.random_ltd.scheduler import CONSUMED_LAYER_TOKENS

WARMUP_TYPES = ("linear", "log")


def layer_token_factor(tokens: float, total: float, warmup: float, warmup_type: str) -> float:
    """The fraction of the base learning rate after ``tokens`` layer tokens."""
    if tokens < warmup:
        if warmup_type == "log":
            return math.log1p(tokens) / math.log1p(warmup)
        return tokens / warmup
    if total <= warmup:
        return 1.0
    return max(0.0, (total - tokens) / (total - warmup))


class WarmupLayerTokenDecayLR:
    """Sets every group's ``lr`` to its initial ``lr`` times ``layer_token_factor`` of the
    tokens ``random_ltd_scheduler`` has booked; ``step()`` after each optimizer step."""

    def __init__(self, optimizer, random_ltd_scheduler, total_layer_tokens: int,
                 warmup_layer_tokens: int = 0, warmup_type: str = "linear"):
        if warmup_type not in WARMUP_TYPES:
            raise ValueError(f"layer_token_lr_schedule.warmup_type: {warmup_type!r}; use one of "
                             f"{WARMUP_TYPES}")
        self.optimizer = optimizer
        self.random_ltd_scheduler = random_ltd_scheduler
        self.total_layer_tokens = total_layer_tokens
        self.warmup_layer_tokens = warmup_layer_tokens
        self.warmup_type = warmup_type
        self.base_lrs = [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups]
        for group, lr in zip(optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = lr
        self.last_batch_iteration = 0
        self._apply()

    def _apply(self) -> None:
        tokens = self.random_ltd_scheduler.state[CONSUMED_LAYER_TOKENS]
        factor = layer_token_factor(tokens, self.total_layer_tokens, self.warmup_layer_tokens,
                                    self.warmup_type)
        self._last_lr = [lr * factor for lr in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def step(self, last_batch_iteration=None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else last_batch_iteration)
        self._apply()

    def get_lr(self) -> list:
        return list(self._last_lr)

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"base_lrs": self.base_lrs, "last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict) -> None:
        self.base_lrs = list(sd["base_lrs"])
        self.last_batch_iteration = sd["last_batch_iteration"]
        self._apply()  # the token count comes back with the random_ltd state
