"""Curriculum learning by sequence length: the legacy ``curriculum_learning`` section (DeepSpeed
removed it in 0.19; dslaunch keeps it), and the difficulty schedule it shares with data sampling.

The engine does not cut the samples: the model does, as in DeepSpeed. Before every training
forward the schedule is moved to ``global_steps + 1`` and, for ``curriculum_type: seqlen``, the
forward gets ``curriculum_seqlen=<difficulty>`` (a model truncates its sequences to it). The
difficulty starts at ``min_difficulty`` and only grows, until ``max_difficulty``:

- ``fixed_linear``: min + (max - min) * t / total_curriculum_step, rounded down to a multiple of
  ``difficulty_step``;
- ``fixed_root``: the same with (t / total) ** (1 / root_degree);
- ``fixed_discrete``: ``difficulty[i]`` up to step ``max_step[i]``, the last one after;
- ``custom``: a function of the step the script sets with
  ``engine.set_custom_curriculum_learning_schedule(fn)``.

Public as ``dslaunch.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler`` (which takes
the section as a dict, as DeepSpeed's does). The config's keys are checked when it is read
(``config/resolve.py``): a missing or wrong one names its key.
"""

from __future__ import annotations

import math

from dslaunch.config.curriculum import schedule_problems


class CurriculumScheduler:
    def __init__(self, config: dict):
        problems = schedule_problems(config)
        if problems:
            raise ValueError("; ".join(problems))
        self.state = {"min_difficulty": config["min_difficulty"],
                      "max_difficulty": config["max_difficulty"],
                      "current_difficulty": config["min_difficulty"],
                      "schedule_type": config["schedule_type"],
                      "schedule_config": dict(config.get("schedule_config") or {})}
        self.custom_get_difficulty = None

    # -- DeepSpeed's accessors ---------------------------------------------------------------------
    def get_current_difficulty(self):
        return self.state["current_difficulty"]

    def set_current_difficulty(self, difficulty) -> None:
        self.state["current_difficulty"] = difficulty

    def set_custom_get_difficulty(self, schedule_function) -> None:
        self.custom_get_difficulty = schedule_function

    def get_state(self) -> dict:
        return self.state

    def set_state(self, state: dict) -> None:
        self.state = state

    # -- the schedules -------------------------------------------------------------------------------
    def get_difficulty(self, global_steps: int):
        kind, cfg = self.state["schedule_type"], self.state["schedule_config"]
        if kind == "fixed_discrete":
            for max_step, difficulty in zip(cfg["max_step"], cfg["difficulty"]):
                if global_steps <= max_step:
                    return difficulty
            return cfg["difficulty"][-1]
        if kind in ("fixed_linear", "fixed_root"):
            degree = 1 if kind == "fixed_linear" else cfg["root_degree"]
            return self._root(global_steps, degree)
        if self.custom_get_difficulty is None:
            raise RuntimeError("curriculum_learning.schedule_type custom: set the schedule with "
                               "engine.set_custom_curriculum_learning_schedule(fn) first")
        return self.custom_get_difficulty(global_steps)

    def _root(self, global_steps: int, degree: float) -> int:
        cfg, lo, hi = (self.state["schedule_config"], self.state["min_difficulty"],
                       self.state["max_difficulty"])
        fraction = (float(global_steps) / cfg["total_curriculum_step"]) ** (1.0 / degree)
        value = math.floor(fraction * (hi - lo) + lo)
        value -= value % cfg["difficulty_step"]
        return min(value, hi)

    def update_difficulty(self, global_steps: int):
        """Move to ``global_steps`` (never past ``max_difficulty``); the difficulty now."""
        if self.state["current_difficulty"] < self.state["max_difficulty"]:
            self.state["current_difficulty"] = self.get_difficulty(global_steps)
        return self.state["current_difficulty"]
