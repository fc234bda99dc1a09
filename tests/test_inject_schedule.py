"""`--inject KIND:rank=R,at=T`: a fault on the job's clock, once per job (launcher/inject.py,
engine/base/fault_injection.py). What benchmarks/bench_resilience.py part e's schedule rests on: with
faults counted from each process's own start, every restarted or replacement process met them
again, so two faults of a "mixed" schedule fired at the same step of each fresh attempt."""

from __future__ import annotations

import os
import time

import pytest
from test_launch import assert_no_leftovers, marker_env

from helpers import SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "inject_train.py"


def test_at_spec_is_parsed_and_checked():
    from dslaunch.launcher.inject import InjectError, parse_spec

    fault = parse_spec("kill:rank=1,at=2m")
    assert fault["at"] == 120.0 and fault["attempt"] == "all" and "after" not in fault
    for bad, says in (("kill:rank=1,at=10,attempt=1", "takes no attempt="),
                      ("kill:rank=1,at=10,step=3", "exactly one trigger"),
                      ("kill:rank=1,at=10,after=3", "exactly one trigger"),
                      ("host-down:host=h,at=10", "takes no 'at'"),
                      ("hang:rank=0,at=soon", "is not a duration")):
        with pytest.raises(InjectError, match=says):
            parse_spec(bad)


def test_at_fault_fires_once_per_job_on_the_jobs_clock(tmp_path, monkeypatch):
    """Two processes of rank 1 (the first, then a restarted or replacement one), same job: the
    fault is not due before t0 + at, fires in the first process that steps after it, and the
    later process drops it. A second job (a new encode) meets its own fault again."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    from dslaunch.engine.base.fault_injection import RankFaults
    from dslaunch.launcher.inject import decode, encode, forget, parse_spec

    start = time.time()
    text = encode([parse_spec("slow:rank=1,at=0.2s,seconds=0.001"), parse_spec("kill:rank=1,step=9")],
                  job_start=start)
    faults = decode(text)
    assert faults[0]["t0"] == start and faults[0]["once"].startswith("dslaunch-inject-")
    assert "once" not in faults[1] and "t0" not in faults[1]  # only at= faults are stamped
    env = {"DSLAUNCH_INJECT": text, "RANK": "1", "DSLAUNCH_RESTART_COUNT": "0"}

    first = RankFaults.from_env(env)
    if time.time() < start + 0.2:
        first.at_step(1)
        assert first.slow == 0.0  # not due yet
    while time.time() < start + 0.25:
        time.sleep(0.01)
    first.at_step(2)
    assert first.slow == 0.001  # fired
    assert os.path.exists(tmp_path / faults[0]["once"])

    # the rank's next process (any attempt: at= faults apply to all) finds it fired
    later = RankFaults.from_env({**env, "DSLAUNCH_RESTART_COUNT": "3"})
    assert [f["kind"] for f in later.pending] == ["slow"]
    later.at_step(3)
    assert later.slow == 0.0 and later.pending == []

    assert forget(text) == 1 and not os.listdir(tmp_path)  # the launcher's cleanup at the end
    other = RankFaults.from_env({**env, "DSLAUNCH_INJECT": encode([parse_spec(
        "slow:rank=1,at=0,seconds=0.002")])})
    other.at_step(1)
    assert other.slow == 0.002  # a new job's marker is its own


@pytest.mark.slow
def test_restarted_job_does_not_meet_an_at_fault_again(tmp_path):
    """Through the real CLI: kill:rank=1,at=0s fires in the first attempt; the restarted job runs
    to its end (with after=0s,attempt=all every attempt would die and the job fail). The marker
    is gone afterwards."""
    marker, env = marker_env()
    env["TMPDIR"] = str(tmp_path)
    r = dslaunch("run", "--nproc-per-node", 2, "--omp-threads", 1, "--grace-period", 1,
                 "--log-dir", tmp_path / "logs", "--max-restarts", 2, "--inject", "kill:rank=1,at=0s",
                 SCRIPT, "--plain", "--steps", 4, env=env, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # fired once, in the first attempt (the rank's own line; the launcher's report quotes it again)
    assert r.stdout.count("dslaunch inject: kill:rank=1,at=0s: rank 1") == 1, r.stdout[-3000:]
    assert r.stderr.count("dslaunch: restarting") == 1 and "DONE 1 4" in r.stdout
    assert not [n for n in os.listdir(tmp_path) if n.startswith("dslaunch-inject-")]
    assert_no_leftovers(marker)
