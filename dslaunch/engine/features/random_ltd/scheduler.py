"""The kept sequence length of random-LTD, step by step (DeepSpeed 0.19.8's
``RandomLTDScheduler``: the same state keys, values and ``state_dict``, so checkpoints carry over).

``fixed_linear``: at step ``s`` the length is ``min_value + (s / require_steps) * (max_value -
min_value)``, floored, rounded down to a multiple of ``seq_per_step`` and capped at
``max_value``; once it reaches ``max_value`` it stays there. ``update_seq(step)`` is called on
every training forward; the first call of a step also books the layer tokens the step consumes
(every sample of the global batch through the dropping layers at the kept length and through the
other layers at ``max_value``), which the layer-token learning-rate schedule reads.
"""

from __future__ import annotations

import math

# DeepSpeed's state keys (its constants), kept so a state_dict is interchangeable
MIN_VALUE, MAX_VALUE, CURRENT_VALUE = "min_value", "max_value", "current_value"
SCHEDULE_CONFIG, SCHEDULE_TYPE = "schedule_config", "schedule_type"
REQUIRE_STEPS, SEQ_PER_STEP = "require_steps", "seq_per_step"
CONSUMED_LAYER_TOKENS, CURRENT_STEP = "consumed_layer_tokens", "current_steps"
SAMPLE_INDEX, ATTENTION_MASK = "sample_idx", "attention_mask"  # shared by the layers of a forward

SCHEDULE_TYPES = ("fixed_linear",)


def fixed_root_value(step: int, lo: int, hi: int, require_steps: int, seq_per_step: int,
                     root_degree: float = 1.0) -> int:
    """The kept length at ``step``: ``(step / require_steps) ** (1 / root_degree)`` of the way from
    ``lo`` to ``hi``, floored to a multiple of ``seq_per_step``, at most ``hi``."""
    progress = (float(step) / require_steps) ** (1.0 / root_degree)
    value = math.floor(progress * (hi - lo) + lo)
    value -= value % seq_per_step
    return min(value, hi)


class RandomLTDScheduler:
    """``config``: the ``random_ltd`` section plus ``global_batch_size`` (the engine adds it;
    DeepSpeed's engine does the same)."""

    def __init__(self, config: dict):
        self.model_layer_num = config["total_layer_num"]
        self.random_ltd_layer_num = config["random_ltd_layer_num"]
        self.config_schedule = config["random_ltd_schedule"]
        self.global_batch_size = config["global_batch_size"]
        self.state: dict = {}
        self.reset_to_init()

    def reset_to_init(self) -> None:
        if self.config_schedule is not None:
            s = self.config_schedule
            self.state.update({MIN_VALUE: s[MIN_VALUE], MAX_VALUE: s[MAX_VALUE],
                               CURRENT_VALUE: s[MIN_VALUE], SCHEDULE_CONFIG: s[SCHEDULE_CONFIG],
                               SCHEDULE_TYPE: s[SCHEDULE_TYPE]})
        self.state[CONSUMED_LAYER_TOKENS] = 0
        self.state[CURRENT_STEP] = -1

    def get_value(self, global_steps: int) -> int:
        if self.state[SCHEDULE_TYPE] != "fixed_linear":
            raise ValueError(f"random_ltd_schedule.schedule_type {self.state[SCHEDULE_TYPE]!r}: "
                             f"only {SCHEDULE_TYPES} is a random-LTD schedule")
        cfg = self.state[SCHEDULE_CONFIG]
        return fixed_root_value(global_steps, self.state[MIN_VALUE], self.state[MAX_VALUE],
                                cfg[REQUIRE_STEPS], cfg[SEQ_PER_STEP])

    def get_current_seq(self) -> int:
        return self.state[CURRENT_VALUE]

    def set_current_seq(self, seq_length: int) -> None:
        self.state[CURRENT_VALUE] = seq_length

    def get_random_ltd_layer_num(self) -> int:
        return self.random_ltd_layer_num

    def get_state(self) -> dict:
        return self.state

    def set_state(self, state: dict) -> None:
        self.state = state

    def update_seq(self, global_steps: int) -> None:
        if self.state[CURRENT_VALUE] < self.state[MAX_VALUE]:
            self.state[CURRENT_VALUE] = self.get_value(global_steps)
        if global_steps != self.state[CURRENT_STEP]:  # once per step, whatever the micro-batches
            kept, full = self.state[CURRENT_VALUE], self.state[MAX_VALUE]
            dropping = self.random_ltd_layer_num
            self.state[CONSUMED_LAYER_TOKENS] += self.global_batch_size * (
                kept * dropping + full * (self.model_layer_num - dropping))
            self.state[CURRENT_STEP] = global_steps

    def get_total_layer_tokens(self, train_iters: int) -> int:
        """The layer tokens ``train_iters`` steps consume (advances this scheduler, as DeepSpeed's
        does: use a fresh one)."""
        for step in range(train_iters):
            self.update_seq(step)
        return self.state[CONSUMED_LAYER_TOKENS]

    _SAVED = (CONSUMED_LAYER_TOKENS, CURRENT_STEP, CURRENT_VALUE, MIN_VALUE, MAX_VALUE)

    def state_dict(self) -> dict:
        return {k: self.state[k] for k in self._SAVED}

    def load_state_dict(self, state_dict: dict) -> None:
        missing = [k for k in self._SAVED if k not in state_dict]
        if missing:
            raise ValueError(f"random_ltd checkpoint state lacks {missing}; it was not written "
                             "by a random-LTD scheduler")
        self.state.update({k: state_dict[k] for k in self._SAVED})
