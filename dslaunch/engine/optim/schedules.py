"""DeepSpeed's learning-rate schedules, with its documented semantics and state.

Each schedule keeps ``last_batch_iteration`` (-1 before the first ``step()``) and sets every
param group's ``lr`` from it; the engine calls ``step()`` after each optimizer step. At
construction (``last_batch_iteration == -1``) the optimizer's lr is set to the schedule's
starting value, as DeepSpeed does, so the first optimizer step already uses the schedule.

- WarmupLR: ``min + (max - min) * gamma``; during warmup gamma = log(i+1)/log(W) ("log") or
  i/W ("linear"); 1 afterwards. W = max(2, warmup_num_steps).
- WarmupDecayLR: warmup as above, then gamma = max(0, (T - i) / max(1, T - W)).
- WarmupCosineLR: lr = base_lr * ratio; warmup ratio = r0 + (1 - r0) * gamma, then
  ratio = max(0, c + (1 - c) * (1 + cos(pi * (i - W + 1) / (T - W))) / 2).
- OneCycle: triangle between cycle_min_lr and cycle_max_lr over
  first+second step sizes (momentum cycled inversely when the optimizer has betas), then
  lr = cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size) (k = steps after the cycle).
- LRRangeTest: lr = min_lr * (1 + step_rate * interval), interval = (i+1)/step_size (floored in
  staircase mode).
"""

from __future__ import annotations

import math


def _per_group(optimizer, value, name):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"scheduler.params.{name}: expected {len(optimizer.param_groups)} "
                             f"values (one per param group), got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class _Schedule:
    """Shared step/state logic; subclasses implement ``get_lr()`` for ``last_batch_iteration``.

    ``get_last_lr()`` before the first ``step()`` is an AssertionError "need to call step()
    first", as in DeepSpeed: Transformers' Trainer matches that text and logs lr 0."""

    def __init__(self, optimizer, last_batch_iteration=-1):
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        self._last_lr = None

    def _apply(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

    def _record_last_lr(self):
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self, last_batch_iteration=None):
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._apply(self.get_lr())
        self._record_last_lr()

    def get_last_lr(self):
        if self._last_lr is None:  # raised, not asserted: the text must survive python -O
            raise AssertionError("need to call step() first")
        return self._last_lr

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        self.last_batch_iteration = sd["last_batch_iteration"]
        self._apply(self.get_lr())
        if self.last_batch_iteration >= 0:  # the saved schedule had stepped
            self._record_last_lr()


class WarmupLR(_Schedule):
    """``warmup_max_lr`` unset: each param group warms up to its own lr, as in DeepSpeed 0.19.8
    (older DeepSpeed, and dslaunch before 2026-11-29, warmed every group to 0.001)."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"scheduler.params.warmup_type: {warmup_type!r} is not 'log' or "
                             "'linear'")
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        if last_batch_iteration == -1:
            self._apply(self.get_lr())

    def _warmup_gamma(self):
        i = self.last_batch_iteration
        if self.warmup_type == "log":
            return self.inverse_log_warm_up * math.log(i + 1)
        return i / self.warmup_num_steps

    def _get_gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._get_gamma()
        return [lo + d * gamma for lo, d in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type="log", last_batch_iteration=-1):
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)

    def _get_gamma(self):
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            return self._warmup_gamma()
        return max(0.0, float(self.total_num_steps - i)
                   / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Schedule):
    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"scheduler.params.warmup_type: {warmup_type!r} is not 'log' or "
                             "'linear'")
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._apply(self.get_lr())

    def get_lr_ratio(self):
        i = self.last_batch_iteration
        if i < 0:
            return 0.0
        if i < self.warmup_num_steps:
            if self.warmup_type == "log":
                ratio = self.inverse_log_warm_up * math.log(i + 1)
            else:
                ratio = i / self.warmup_num_steps
            return self.warmup_min_ratio + ratio * (1.0 - self.warmup_min_ratio)
        real_step = i - self.warmup_num_steps + 1
        real_total = max(1, self.total_num_steps - self.warmup_num_steps)
        # past total_num_steps the lr stays at the floor (DeepSpeed 0.19.8 clamps the progress;
        # the cosine went back up before)
        cosine = (1 + math.cos(math.pi * min(1.0, real_step / real_total))) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self):
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration, "org_lrs": list(self.org_lrs)}

    def load_state_dict(self, sd):
        self.org_lrs = list(sd.get("org_lrs", self.org_lrs))
        super().load_state_dict(sd)


class OneCycle(_Schedule):
    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0,
                 cycle_first_step_size=2000, cycle_second_step_size=None,
                 cycle_first_stair_count=0, cycle_second_stair_count=None, decay_step_size=0,
                 cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.decay_step_size = decay_step_size
        self.decay_lr_rate = decay_lr_rate
        self.decay_mom_rate = decay_mom_rate
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_lr_rate, 0)
        self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_mom_rate, 0)
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.cycle_momentum = bool(cycle_momentum) and "betas" in optimizer.defaults
        self.min_moms = [(cycle_min_mom, 0.99)] * len(optimizer.param_groups)
        self.max_moms = [(cycle_max_mom, 0.99)] * len(optimizer.param_groups)
        if last_batch_iteration == -1:
            self._apply(self.min_lrs)
            if self.cycle_momentum:
                for group, mom in zip(optimizer.param_groups, self.min_moms):
                    group["betas"] = self._betas(group, mom)

    @staticmethod
    def _betas(group, mom):
        # keep the optimizer's beta2 (DeepSpeed writes 0.99 there; we only cycle beta1)
        return (mom[0], tuple(group["betas"])[1])

    def _scale_factor(self):
        it = self.last_batch_iteration + 1
        cycle = math.floor(1 + it / self.total_size)
        x = 1.0 + it / self.total_size - cycle
        if x <= self.step_ratio:
            return x / self.step_ratio
        return (x - 1) / (self.step_ratio - 1)

    def get_lr(self):
        if self.last_batch_iteration < self.total_size:
            s = self._scale_factor()
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        k = self.last_batch_iteration - self.total_size + 1
        factor = 1 + self.decay_lr_rate * (k / self.decay_step_size)
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self):
        if self.last_batch_iteration < self.total_size:
            s = self._scale_factor()
            return [(hi[0] - (hi[0] - lo[0]) * s, lo[1])
                    for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        k = self.last_batch_iteration - self.total_size + 1
        factor = 1 + self.decay_mom_rate * (k / self.decay_step_size)
        return [(b0 * factor, b1) for b0, b1 in self.max_moms]

    def _apply(self, lrs):
        super()._apply(lrs)

    def step(self, last_batch_iteration=None):
        super().step(last_batch_iteration)
        if self.cycle_momentum:
            for group, mom in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = self._betas(group, mom)


class LRRangeTest(_Schedule):
    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False,
                 last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = bool(lr_range_test_staircase)
        if last_batch_iteration == -1:
            self._apply(self.min_lr)

    def _interval(self):
        x = float(self.last_batch_iteration + 1) / self.step_size
        return math.floor(x) if self.staircase else x

    def get_lr(self):
        increase = 1 + self.step_rate * self._interval()
        return [lo * increase for lo in self.min_lr]


SCHEDULES = {c.__name__: c for c in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
                                     LRRangeTest)}
# DeepSpeed's name for the list of schedule class names (Accelerate tests
# ``type(scheduler).__name__ in VALID_LR_SCHEDULES`` to recognise one)
VALID_LR_SCHEDULES = list(SCHEDULES)


def build_scheduler(scheduler_cfg, optimizer):
    """``scheduler_cfg``: the config's typed ``scheduler`` section (``.type``, ``.params``); its
    type and params were checked against ``SCHEDULES``' signatures by ``dslaunch.config``."""
    params = {k: v for k, v in (scheduler_cfg.params or {}).items() if v is not None}
    return SCHEDULES[scheduler_cfg.type](optimizer, **params)
