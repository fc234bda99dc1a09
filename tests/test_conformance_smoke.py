"""benchmarks/conformance.py's machinery on one tiny client, under dslaunch only (no DeepSpeed
venv, no DeepSpeedExamples checkout): the snippet of DeepSpeed's getting-started tutorial is
copied to a scratch directory, started by `dslaunch run --as-deepspeed` on 2 ranks, its printed
losses parsed, and the row written to the JSON report. Plus the rule every example edit follows:
it must match the original exactly as often as it says, or the client is not run."""

import json
import math
import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import conformance


def test_sweep_runs_one_tutorial_client_under_dslaunch(tmp_path):
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "conformance.py"), "--sides", "dslaunch",
         "--only", "tut-getting-started", "--keep", str(tmp_path / "scratch"), "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["clients"]
    run = row["dslaunch"]
    assert run["passed"], run.get("log_tail")
    assert "--as-deepspeed" in run["command"]
    # the snippet trains 3 steps, saves, loads the checkpoint and trains 3 more
    assert len(run["losses"]) == 6 and all(math.isfinite(v) for v in run["losses"])
    assert "deepspeed" not in row and "loss_agreement" not in row
    assert "tut-getting-started" in proc.stdout and "yes" in proc.stdout
    log = (tmp_path / "scratch" / "tut-getting-started" / "dslaunch.log").read_text()
    assert "step 5 loss" in log


def test_an_edit_must_match_the_original_as_often_as_it_says():
    text = "import torchvision\r\nx = 1\r\nx = 1\r\n"
    edit = conformance.Edit("import torchvision\n", "", "no-download")
    assert conformance.apply_edits(text, [edit], "") == "x = 1\nx = 1\n"
    with pytest.raises(ValueError, match="no longer applies"):
        conformance.apply_edits(text, [conformance.Edit("x = 1\n", "x = 2\n", "r")], "")
    twice = conformance.Edit("x = 1\n", "x = 2\n", "r", count=2)
    assert conformance.apply_edits(text, [twice], "").endswith("x = 2\nx = 2\n")
    # an edit for another file of the client leaves this one alone
    other = conformance.Edit("x = 1\n", "", "r", path="ds_config.json")
    assert conformance.apply_edits(text, [other], "") == text.replace("\r\n", "\n")


def test_every_listed_client_is_well_formed():
    names = [c.name for c in conformance.clients()]
    assert len(names) == len(set(names))
    for c in conformance.clients():
        if c.kind != "example":
            for f in [c.script, *c.files]:
                assert (conformance.CLIENTS_DIR / f).is_file(), (c.name, f)
        for e in c.edits:
            assert e.reason.split(":")[0] in ("no-download", "cpu", "short", "compare"), e.reason
