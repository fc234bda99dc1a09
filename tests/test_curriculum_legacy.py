"""The legacy seqlen curriculum (``curriculum_learning``; ``engine/features/curriculum.py``), which DeepSpeed
removed in 0.19 and dslaunch keeps: every training forward gets ``curriculum_seqlen``, moved to
``global_steps + 1`` first; the schedules' values; the keys each schedule needs, refused by name
when missing.

DeepSpeed 0.18.9, the last release with the legacy section (its own venv, torch 2.13.0+cpu,
torchrun, 1 rank, tests/scripts/curriculum_rank.py with ``--runtime deepspeed`` and
configs/curriculum_seqlen.json plus ``"torch_adam": true``), measured 2026-11-27: the same 24
sequence lengths and the same 12 losses to the printed 6 decimals (3.445042 ... 2.294351)."""

import math
import re

import pytest

from dslaunch.config import ConfigError, resolve_config
from dslaunch.engine.features.curriculum import CurriculumScheduler
from helpers import ROOT, launch


def _linear(t, lo=8, hi=64, total=10, step=8):
    value = math.floor(t / total * (hi - lo) + lo)
    return min(value - value % step, hi)


@pytest.mark.slow
def test_every_training_forward_gets_the_scheduled_seqlen(tmp_path):
    proc = launch(tmp_path, None, "curriculum_rank.py",
                  ["--config", ROOT / "configs" / "curriculum_seqlen.json"], nproc=1)
    seen = [(int(n), int(v)) for n, v in re.findall(r"SEQLEN (\d+) (\d+)", proc.stdout)]
    assert [n for n, _ in seen] == list(range(1, 25))  # 12 steps x 2 micro-batches
    # forward n belongs to step (n - 1) // 2; the schedule is read at global_steps + 1
    assert [v for _, v in seen] == [_linear((n - 1) // 2 + 1) for n, _ in seen]
    assert seen[0][1] == 8 and seen[-1][1] == 64
    losses = [float(v) for v in re.findall(r"LOSS \d+ (\S+)", proc.stdout)]
    assert losses[-1] < losses[0]  # it trains on the lengths it is given


def test_schedules():
    root = CurriculumScheduler({"min_difficulty": 8, "max_difficulty": 128,
                                "schedule_type": "fixed_root",
                                "schedule_config": {"total_curriculum_step": 100,
                                                    "difficulty_step": 8, "root_degree": 2}})
    assert [root.update_difficulty(t) for t in (1, 25, 50, 100, 200)] == [16, 64, 88, 128, 128]
    discrete = CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 3,
                                    "schedule_type": "fixed_discrete",
                                    "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]}})
    assert [discrete.update_difficulty(t) for t in (1, 5, 6, 10, 11, 50)] == [1, 1, 2, 2, 3, 3]
    custom = CurriculumScheduler({"min_difficulty": 4, "max_difficulty": 32,
                                  "schedule_type": "custom"})
    with pytest.raises(RuntimeError, match="set_custom_curriculum_learning_schedule"):
        custom.update_difficulty(1)
    custom.set_custom_get_difficulty(lambda t: 4 * t)
    assert [custom.update_difficulty(t) for t in (1, 4, 8, 9)] == [4, 16, 32, 32]  # grows to max


@pytest.mark.parametrize("section, message", [
    ({"schedule_type": "fixed_linear", "max_difficulty": 64,
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}},
     "curriculum_learning.min_difficulty: missing"),
    ({"schedule_type": "fixed_root", "min_difficulty": 8, "max_difficulty": 64,
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}},
     "curriculum_learning.schedule_config.root_degree: missing; the fixed_root schedule needs it"),
    ({"schedule_type": "fixed_discrete", "min_difficulty": 1, "max_difficulty": 3,
      "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5]}},
     "give one more difficulty than max_step entries"),
    ({"schedule_type": "linear", "min_difficulty": 1, "max_difficulty": 3},
     "curriculum_learning.schedule_type: \"linear\" is not allowed"),
])
def test_a_bad_section_names_its_key(section, message):
    with pytest.raises(ConfigError) as err:
        resolve_config({"train_micro_batch_size_per_gpu": 1,
                        "curriculum_learning": {"enabled": True, **section}}, world_size=1)
    assert message in str(err.value)
