"""dslaunch's learning-rate schedules against DeepSpeed 0.19.8's, case by case: each case's
config ``scheduler`` section goes through dslaunch's config (so the defaults it fills are the
ones checked) and the engine's scheduler builder, and the lr and beta1 before every step must
equal what DeepSpeed's own lr_schedules.py gave (tests/fixtures/lr_schedules_ds0198.json,
written by tests/fixtures/lr_schedules_peer.py in DeepSpeed's venv).

Two differences this found: WarmupLR without warmup_max_lr warmed to 0.001 (DeepSpeed 0.19.8:
each group's own lr), and WarmupCosineLR past total_num_steps went back up the cosine
(DeepSpeed: stays at the floor)."""

import importlib.util
import json
from pathlib import Path

import pytest

from dslaunch.config import resolve_config
from dslaunch.engine.optim import schedules
from dslaunch.engine.optim.schedules import build_scheduler

FIXTURES = Path(__file__).parent / "fixtures"
_spec = importlib.util.spec_from_file_location("lr_schedules_peer",
                                               FIXTURES / "lr_schedules_peer.py")
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)
RECORDED = json.loads(peer.FIXTURE.read_text())


class _FromConfig:
    """A stand-in for the schedules module whose classes are built the way the engine builds a
    config's scheduler (resolve_config fills the defaults, then build_scheduler)."""

    def __getattr__(self, name):
        def build(optimizer, **params):
            cfg = resolve_config({"train_batch_size": 1,
                                  "scheduler": {"type": name, "params": params}}).typed
            return build_scheduler(cfg.scheduler, optimizer)
        return build


def test_the_fixture_is_deepspeed_0_19_8s_and_covers_every_schedule():
    assert RECORDED["deepspeed"] == "0.19.8"
    assert set(RECORDED["traces"]) == set(peer.CASES)
    assert {name for name, _ in peer.CASES.values()} == set(schedules.SCHEDULES)


@pytest.mark.parametrize("case", sorted(peer.CASES))
def test_schedule_equals_deepspeeds(case):
    name, params = peer.CASES[case]
    got = peer.trace(_FromConfig(), name, params)
    want = RECORDED["traces"][case]
    assert len(got) == len(want) == peer.STEPS
    for step, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, rel=1e-12, abs=1e-15), f"{case}, before step {step}"
