"""The DeepSpeed name table: every present row resolves to a real object through the face a
ported script imports, every missing one fails with the reason, and docs/porting.md is current."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dslaunch import deepspeed_names as names

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", [n for n in names.NAMES if n.present], ids=lambda n: n.deepspeed)
def test_present_names_resolve_through_the_public_face(row):
    ours = names.resolve(row)
    module, _, attr = row.dslaunch_name.rpartition(".")
    if row.ours.partition(":")[2]:  # an attribute: the face module must hand out the same object
        assert getattr(importlib.import_module(module), attr) is ours
    else:
        assert importlib.import_module(row.dslaunch_name) is ours


MISSING = [n for n in names.NAMES if not n.present]


@pytest.fixture(scope="module")
def missing_answers():
    """How each missing name fails, from one fresh interpreter (the import system caches failed
    imports, and one process for all rows keeps the test quick): the module import first, then,
    if that fails, the attribute of the face above it."""
    code = """
import importlib, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    parent, _, attr = name.rpartition(".")
    try:
        importlib.import_module(name)
        out[name] = "imported"
        continue
    except ImportError as e:
        out[name] = f"ImportError {e}"  # a missing module, ...
    try:
        face = importlib.import_module(parent)
    except ImportError:
        continue
    try:  # or a missing attribute of a face
        getattr(face, attr)
        out[name] += " | resolved"
    except AttributeError as e2:
        out[name] += f" | AttributeError {e2}"
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code, json.dumps([n.dslaunch_name for n in MISSING])],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("row", MISSING, ids=lambda n: n.deepspeed)
def test_missing_names_say_what_brings_them(row, missing_answers):
    """A missing module fails to import, a missing attribute of a face fails to resolve, both
    with the row's reason."""
    out = missing_answers[row.dslaunch_name]
    assert row.why in out and out.split()[0] == "ImportError" and "resolved" not in out, out


def test_a_module_of_ours_is_never_hidden_by_the_table():
    import dslaunch.config  # noqa: F401  (no row: the finder stays out of the way)


def test_porting_page_is_generated_from_the_table():
    page = (ROOT / "docs" / "porting.md").read_text()
    assert names.render_porting(page) == page, \
        "docs/porting.md is stale: run `python -m dslaunch.deepspeed_names docs/porting.md`"
    for row in names.NAMES:
        assert f"`{row.deepspeed}`" in page


# -- the deepspeed.runtime faces behave as DeepSpeed's --------------------------------------------

def test_runtime_submodules_answer_as_attributes_after_import_dslaunch():
    """`import deepspeed` then `deepspeed.runtime.engine.DeepSpeedEngine` works in DeepSpeed."""
    code = ("import dslaunch; print(dslaunch.runtime.engine.DeepSpeedEngine.__name__, "
            "dslaunch.runtime.zero.partition_parameters.ZeroParamStatus.AVAILABLE.name, "
            "dslaunch.runtime.pipe.engine.PipelineEngine.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT).stdout.split()
    assert out == ["DSLaunchEngine", "AVAILABLE", "PipelineEngine"]
    from dslaunch.runtime.dataloader import RepeatingLoader
    from dslaunch.utils import RepeatingLoader as from_utils

    assert RepeatingLoader is from_utils  # Megatron-DeepSpeed imports it from runtime.dataloader


def test_lr_schedule_names_and_offload_enums():
    from dslaunch.config.schema import OFFLOAD_DEVICES
    from dslaunch.runtime import lr_schedules
    from dslaunch.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

    assert sorted(lr_schedules.VALID_LR_SCHEDULES) == sorted(
        ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"])
    assert all(getattr(lr_schedules, n).__name__ == n for n in lr_schedules.VALID_LR_SCHEDULES)
    assert tuple(d.value for d in OffloadDeviceEnum) == OFFLOAD_DEVICES  # the config's choices
    assert OffloadDeviceEnum.cpu == "cpu" and OffloadStateTypeEnum.optim_states == "optim_states"
    assert {s.name for s in OffloadStateTypeEnum} == {
        "optim_states", "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer"}


def test_runtime_utils(capsys):
    import random
    from collections import namedtuple

    import torch

    from dslaunch.runtime.utils import move_to_device, see_memory_usage, set_random_seed

    draws = []
    for _ in range(2):
        set_random_seed(3)
        draws.append((random.random(), torch.rand(1).item()))
    assert draws[0] == draws[1]
    Pair = namedtuple("Pair", "a b")
    item = {"x": [torch.ones(1), (torch.zeros(2), "s")], "p": Pair(torch.ones(1), 1)}
    moved = move_to_device(item, "meta")
    assert moved["x"][0].is_meta and moved["x"][1][0].is_meta and moved["x"][1][1] == "s"
    assert isinstance(moved["p"], Pair) and moved["p"].a.is_meta and moved["p"].b == 1
    only_big = move_to_device(item, "meta", criterion_func=lambda t: t.numel() > 1)
    assert only_big["x"][1][0].is_meta and not only_big["x"][0].is_meta
    see_memory_usage("quiet")
    see_memory_usage("loud", force=True)
    out = capsys.readouterr().out
    assert "quiet" not in out and "loud | MA" in out
