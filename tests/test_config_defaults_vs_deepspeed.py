"""What dslaunch's config fills in for a key left out, against DeepSpeed 0.19.8's own defaults
(tests/fixtures/config_defaults_ds0198.json, written by tests/fixtures/config_defaults_peer.py in
DeepSpeed's venv): every key both know must default alike, except the few named below, each with
its reason. Found this way: bf16.check_grad_overflow (DeepSpeed: true) and steps_per_print
(DeepSpeed 0.19.8: none, no step log) still had an older DeepSpeed's defaults."""

import json
from pathlib import Path

from dslaunch.config import resolve_config

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "config_defaults_ds0198.json").read_text())
DEFAULTS = RECORDED["defaults"]

# keys whose default differs on purpose or only in form
NOT_COMPARED = {
    # the minimal config below gives train_batch_size 1, from which the others are inferred
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    # DeepSpeed: absent section (None); dslaunch: the section with device "none" (the same off)
    "zero_optimization.offload_param", "zero_optimization.offload_optimizer",
    # DeepSpeed: []; dslaunch: null; both mean "every op"
    "comms_logger.prof_ops",
}
def _ours():
    """key -> dslaunch's resolved default (KeyError for a key it does not have)."""
    resolved = resolve_config({"train_batch_size": 1})
    return lambda path: resolved.get(path, KeyError)


def _same(ours, theirs) -> bool:
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours is theirs
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        return float(ours) == float(theirs)
    return ours == theirs


def test_fixture_is_deepspeed_0_19_8s():
    assert RECORDED["deepspeed"] == "0.19.8" and len(DEFAULTS) > 100


def test_defaults_equal_deepspeeds():
    get = _ours()
    compared, differ = 0, []
    for key, theirs in sorted(DEFAULTS.items()):
        if key in NOT_COMPARED:
            continue
        ours = get(key)
        if ours is KeyError:  # a key only DeepSpeed has (its getters' names, aliases)
            continue
        compared += 1
        if not _same(ours, theirs):
            differ.append(f"{key}: DeepSpeed {theirs!r}, dslaunch {ours!r}")
    assert not differ, "\n".join(differ)
    assert compared >= 80  # the comparison reached the sections, not only the top level


def test_overlap_comm_is_ours_at_stage_2():
    """The one default that differs on purpose (docs/porting.md): DeepSpeed resolves
    overlap_comm to on for stage 3 only; dslaunch overlaps stage 2 too, at most two buckets in
    flight (zero/grad_reduce.py). At stage 0, the fixture's, both are off."""
    assert DEFAULTS["zero_optimization.overlap_comm"] is False
    for stage, want in ((0, False), (1, False), (2, True), (3, True)):
        got = resolve_config({"train_batch_size": 1, "zero_optimization": {"stage": stage}})
        assert got.values["zero_optimization"]["overlap_comm"] is want, stage
