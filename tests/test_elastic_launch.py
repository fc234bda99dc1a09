"""The restart policy on one host, with real processes: progress reported by the ranks (progress
records, carried by the heartbeats) keeps a failing job restarting up to its budget and fills
the incident records; a blocked launcher stdout is not taken for a lost host."""

from __future__ import annotations

import subprocess
import time

import pytest

from dslaunch.launcher import incidents
from helpers import DSLAUNCH, dslaunch

pytestmark = pytest.mark.slow

PROGRESSING = """
import os, sys, time
from dslaunch import progress_record
restart = int(os.environ["DSLAUNCH_RESTART_COUNT"])
w = progress_record.writer()
w.checkpoint_loaded(restart * 10 - 10 if restart else -1)
w.step(restart * 10 + 4)
time.sleep(0.2)
w.step(restart * 10 + 5)  # a step of about 0.2 s (the goodput's step time)
time.sleep(2.5)  # two heartbeats carry the record
sys.exit(1 if os.environ["RANK"] == "0" else 0)
"""

FLOOD = """
import sys
line = "x" * 100 + "\\n"
for _ in range(2000):
    sys.stdout.write(line * 50)
"""


def test_progress_keeps_restarting_and_is_recorded(tmp_path):
    (tmp_path / "p.py").write_text(PROGRESSING)
    r = dslaunch("run", "--nproc-per-node", 2, "--grace-period", 1, "--max-restarts", 3,
                 "--log-dir", tmp_path / "logs", "p.py", cwd=tmp_path, timeout=180)
    assert r.returncode == 1, r.stderr[-3000:]  # the budget ran out: no crash loop (exit 3)
    assert "restarting the whole job (restart 3 of 3)" in r.stderr and "crash loop" not in r.stderr
    recs = incidents.read(str(tmp_path / "logs" / "incidents.jsonl"))
    assert [x["action"] for x in recs] == ["restart"] * 3 + ["stop"]
    assert [x["last_step"] for x in recs] == [5, 15, 25, 35]
    assert [x["resumed_from"] for x in recs[:3]] == [0, 10, 20]
    assert [x["steps_redone"] for x in recs[:3]] == [5, 5, 5]
    assert all(x["seconds_to_training"] > 0 for x in recs[:3])
    for x in recs[:3]:  # the split of the time back to training, every part seen
        assert None not in (x["detect_seconds"], x["stop_seconds"], x["replan_seconds"],
                            x["restart_seconds"], x["load_seconds"]), x
    assert recs[-1]["exit_code"] == 1 and recs[-1]["culprit_rank"] == 0
    assert all(x["detector"] == "exit" and x["culprit_host"] == "localhost" for x in recs)
    assert "run summary: 4 fault(s) handled in 4 attempt(s)" in r.stderr
    assert "No host was excluded" in r.stderr  # one host: the job cannot go on without it
    # per fault: the steps lost and the time back to training, phase by phase
    for n in (1, 2, 3):
        line = next(ln for ln in r.stderr.splitlines() if f"dslaunch: fault {n}: " in ln)
        assert "5 step(s) lost, training again after " in line, line
        assert all(f" {p} " in line for p in ("detect", "abort", "re-plan", "rebuild")), line
        assert "state transfer" in line, line
    good = next(ln for ln in r.stderr.splitlines() if "dslaunch: goodput " in ln)
    value = float(good.split("goodput ")[1].split(":")[0])
    assert 0 < value < 1 and "35 step(s) kept x 0.2" in good, good  # 35 - 0: the last step


def test_failed_run_without_log_dir_or_restarts_leaves_no_files(tmp_path):
    (tmp_path / "f.py").write_text("import sys; sys.exit(2)\n")
    r = dslaunch("run", "--nproc-per-node", 1, "f.py", cwd=tmp_path)
    assert r.returncode == 1 and "job failed: rank 0" in r.stderr
    assert "run summary" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.py"]


def test_blocked_stdout_is_not_a_lost_host(tmp_path):
    """Heartbeats travel behind the ranks' lines: while nobody reads the launcher's stdout (a
    paused pager), the agent's events wait too. That must not be taken for a silent host."""
    (tmp_path / "flood.py").write_text(FLOOD)
    proc = subprocess.Popen([*DSLAUNCH, "run", "--nproc-per-node", "2", "--heartbeat-timeout", "1",
                             "flood.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # stdout unread: every pipe on the way fills up and the ranks block
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "lost" not in err and out.count("x" * 100) == 2 * 2000 * 50
