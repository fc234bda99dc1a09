"""What a plain ``import deepspeed`` leaves reachable: every DeepSpeed module that DeepSpeed's
own ``import deepspeed`` loads (measured, ``dslaunch/deepspeed_imports.py``) is, after a plain
``import dslaunch`` and under the ``--as-deepspeed`` alias, either reachable as an attribute the
same way (``deepspeed.moe.layer.MoE`` after only ``import deepspeed``: DeepSpeedExamples' CIFAR-10
MoE mode) or a missing row of the table whose reason the attribute error carries. And that the
lazy access leaves ``import dslaunch`` as light as it was: no torch, no submodules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dslaunch import deepspeed_names as names
from dslaunch.deepspeed_imports import IMPORTED, NOT_THE_MODULE
from dslaunch.launcher.plan import free_port
from helpers import ROOT

WALK = r"""
import importlib, json, sys
from dslaunch import deepspeed_names as names
from dslaunch.deepspeed_imports import IMPORTED
top = {top}
out = {{}}
for name in IMPORTED:
    obj = top
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
    except (AttributeError, ImportError) as exc:
        out[name] = [type(exc).__name__, str(exc)]
        continue
    row = names.BY_NAME.get("deepspeed." + name)
    same = row is not None and row.present and obj is names.resolve(row)
    out[name] = ["same" if same else "other", repr(obj)[:200]]
print(json.dumps(out))
"""

PLAIN = "__import__('dslaunch')"
ALIAS = ("(__import__('dslaunch.as_deepspeed').as_deepspeed.install("
         "environ={'RANK': '1'}), __import__('deepspeed'))[1]")


def _walk(top: str) -> dict:
    r = subprocess.run([sys.executable, "-c", WALK.format(top=top)], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module", params=["import dslaunch", "import deepspeed (alias)"])
def reached(request):
    return _walk(PLAIN if request.param == "import dslaunch" else ALIAS)


def test_every_module_deepspeed_imports_is_reachable_or_a_missing_row(reached):
    problems = []
    for name in IMPORTED:
        how, what = reached[name]
        row = names.row("deepspeed." + name)
        if row is None or (row.present and row.deepspeed != "deepspeed." + name):
            problems.append(f"deepspeed.{name}: no row in deepspeed_names.py (add a face or a "
                            f"missing row with why); reached {how}: {what}")
        elif row.present and how != "same" and name not in NOT_THE_MODULE:
            problems.append(f"deepspeed.{name}: present row, but the attribute gives {how}: "
                            f"{what}")
        elif not row.present and (how != "AttributeError" or row.why not in what):
            problems.append(f"deepspeed.{name}: missing row, but the attribute gives {how}: "
                            f"{what} (expected an AttributeError with the row's why)")
    assert not problems, "\n".join(problems)


def test_the_measured_list_is_the_real_import():
    assert len(IMPORTED) == len(set(IMPORTED)) > 400
    for name in ("moe.layer", "moe.sharded_moe", "runtime.zero.partition_parameters",
                 "ops.op_builder", "monitor.monitor", "comm", "pipe"):
        assert name in IMPORTED
    assert NOT_THE_MODULE <= set(IMPORTED)


def test_cifar_moe_call_after_only_import_deepspeed():
    """DeepSpeedExamples' cifar10_deepspeed.py (--moe): `deepspeed.moe.layer.MoE(...)` after
    `import deepspeed` only, and utils' param-group helper the same way."""
    code = """
import torch
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
fc3 = torch.nn.Linear(84, 84)
moe = deepspeed.moe.layer.MoE(hidden_size=84, expert=fc3, num_experts=2, ep_size=1,
                              use_residual=False, k=1, min_capacity=0, noisy_gate_policy=None)
out, aux, _ = moe(torch.randn(4, 84))
groups = deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer(
    {"params": list(moe.parameters()), "name": "parameters"})
print(type(moe).__module__, tuple(out.shape), len(groups))
"""
    env = {"DSLAUNCH_AS_DEEPSPEED": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    module, shape = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert module.startswith("dslaunch.") and shape == "(4, 84) 2", r.stdout


def test_import_dslaunch_stays_light():
    code = ("import sys, dslaunch; print(sorted(m for m in sys.modules if m.startswith("
            "('dslaunch', 'torch'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == ["dslaunch", "dslaunch.missing_modules"]
