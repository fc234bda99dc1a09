"""`dslaunch run --inject`: each rank fault does what it says, on this host, through the real CLI
(tests/scripts/inject_train.py: a tiny engine job, or a plain torch loop calling
dslaunch.inject.tick); a bad spec is refused before anything starts. The host faults are in
tests/multihost/test_inject_hosts.py."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time

import pytest
from test_launch import assert_no_leftovers, marker_env

from helpers import DSLAUNCH, SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "inject_train.py"
RUN = ("run", "--nproc-per-node", 2, "--omp-threads", 1, "--grace-period", 1)


@pytest.mark.parametrize("spec, says", [
    ("kil:rank=1,step=2", "unknown fault 'kil'"),
    ("kill:rank=1", "give exactly one trigger"),
    ("kill:rank=2,step=1", "rank=2 is not in this job (world size 2)"),
    ("kill:rank=1,stp=1", "kill takes no 'stp'"),
    ("slow:rank=0,step=1", "slow needs seconds=S"),
    ("hang:rank=0,after=soon", "after='soon' is not a duration"),
    ("host-down:host=host9,after=1", "host=host9 is not in this job (hosts: localhost)"),
    ("kill:rank=0,step=1,attempt=-1", "attempt='-1' must be >= 0"),
])
def test_bad_spec_is_refused_before_anything_starts(tmp_path, spec, says):
    marker, env = marker_env()
    r = dslaunch(*RUN, "--inject", "kill:rank=0,step=3", "--inject", spec, SCRIPT, env=env,
                 timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"--inject {spec!r}: {says}" in r.stderr
    assert "STEP" not in r.stdout and "[rank" not in r.stdout  # no rank ever started
    assert_no_leftovers(marker)


@pytest.mark.slow
def test_kill_fails_the_job_naming_the_rank_and_sigkill():
    marker, env = marker_env()
    # the step's sleep keeps rank 0 out of its next collective for a while after the kill, so its
    # own error (connection reset by the dead peer) comes well after rank 1's death, the root cause
    r = dslaunch(*RUN, "--inject", "kill:rank=1,step=3", SCRIPT, "--steps", 6, "--step-sleep", 0.5,
                 env=env)
    assert r.returncode == 1, r.stderr
    assert "job failed: rank 1 (host localhost) was killed by SIGKILL" in r.stderr
    assert "kill:rank=1,step=3: rank 1" in r.stderr and "kills itself (SIGKILL) at step 3" in r.stderr
    # it fires inside engine.step() of step 3: the script never prints that step
    assert "[rank 1] STEP 1 2 " in r.stdout and "[rank 1] STEP 1 3 " not in r.stdout
    assert "DONE" not in r.stdout
    assert_no_leftovers(marker)


@pytest.mark.slow
def test_slow_rank_sleeps_every_step_and_the_job_still_finishes():
    # the plain torch loop: the fault comes from dslaunch.inject.tick, not the engine
    r = dslaunch(*RUN, "--inject", "slow:rank=1,step=2,seconds=0.05", SCRIPT, "--plain",
                 "--steps", 5)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rank1 = [ln for ln in lines if ln.startswith("[rank 1] ")]  # rank 0's lines interleave
    said = [i for i, ln in enumerate(rank1)
            if ln.startswith("[rank 1] dslaunch inject: slow:rank=1,step=2,seconds=0.05: rank 1 "
                             "sleeps 0.05 s at every step from step 2")]
    assert len(said) == 1, r.stdout
    assert rank1[said[0] - 1].startswith("[rank 1] STEP 1 2 ")  # it fired in tick(2)
    assert "dslaunch inject" not in "\n".join(ln for ln in lines if ln.startswith("[rank 0]"))
    assert "[rank 0] DONE 0 5" in lines and "[rank 1] DONE 1 5" in lines


@pytest.mark.slow
def test_host_down_here_is_a_lost_host():
    # the local runner's one host: its agent kills the ranks and goes silent (the fake hosts of
    # tests/multihost/test_inject_hosts.py do the same over ssh); the plain loop reports its steps
    marker, env = marker_env()
    r = dslaunch(*RUN, "--heartbeat-timeout", 2, "--inject", "host-down:host=localhost,step=3", SCRIPT,
                 "--plain", "--steps", 100000, "--step-sleep", 0.05, env=env)
    assert r.returncode == 1, r.stderr
    assert ("dslaunch agent on localhost: inject host-down:host=localhost,step=3: killing this "
            "host's ranks and going silent") in r.stderr
    assert "job failed: host localhost (node 0) lost: no heartbeat for 2 s" in r.stderr
    assert "[rank 0] STEP 0 3 " in r.stdout and "DONE" not in r.stdout
    assert_no_leftovers(marker)


def test_attempt_filter_skips_a_restarted_job(tmp_path):
    # no launcher: the rank side alone, with the restart count the agent gives a restarted job
    from dslaunch.engine.base.fault_injection import RankFaults
    from dslaunch.launcher.inject import encode, parse_spec

    faults = encode([parse_spec("kill:rank=1,step=3"), parse_spec("hang:rank=1,step=5,attempt=1"),
                     parse_spec("slow:rank=1,after=0,seconds=0.01,attempt=all")])
    env = {"DSLAUNCH_INJECT": faults, "RANK": "1"}
    first = RankFaults.from_env({**env, "DSLAUNCH_RESTART_COUNT": "0"})
    again = RankFaults.from_env({**env, "DSLAUNCH_RESTART_COUNT": "1"})
    assert [f["kind"] for f in first.pending] == ["kill", "slow"]
    assert [f["kind"] for f in again.pending] == ["hang", "slow"]
    assert RankFaults.from_env({**env, "RANK": "0"}) is None
    again.at_step(1)  # after=0 is due at once (seconds since the process started); step=5 is not
    assert again.slow == 0.01 and [f["kind"] for f in again.pending] == ["hang"]
    assert RankFaults.from_env({"RANK": "1"}) is None


def _reader(proc) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=read, daemon=True).start()
    return q


def _lines(q: queue.Queue, seen: list, timeout: float):
    """The launcher's stdout lines as they come (each also kept in ``seen``), until ``timeout``;
    None once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        if line is not None:
            seen.append(line)
        yield line
        if line is None:
            return


def _drain(q: queue.Queue, seen: list, timeout: float = 30) -> None:
    """The rest of the output, once the launcher has ended (a rank's lines can come after the
    line a test waited for: under load, rank 0's step line after rank 1's stack dump)."""
    for _ in _lines(q, seen, timeout):
        pass


def _wait_for(q: queue.Queue, pattern: str, seen: list, timeout: float = 90) -> re.Match:
    for line in _lines(q, seen, timeout):
        assert line is not None, "launcher ended early:\n" + "".join(seen[-40:])
        m = re.search(pattern, line)
        if m:
            return m
    pytest.fail(f"no line matching {pattern!r} in time:\n" + "".join(seen[-40:]))


@pytest.mark.slow
def test_hang_blocks_the_rank_in_injected_hang(tmp_path):
    """Nothing ends a hang on its own here (the watchdog is what would): the stack dump the agent
    takes on a failure (SIGUSR1, faulthandler) shows the rank inside _injected_hang, and the other
    rank waits; SIGTERM then stops the job with nothing left."""
    marker, env = marker_env()
    logs = tmp_path / "logs"
    proc = subprocess.Popen([*DSLAUNCH, *map(str, RUN), "--log-dir", str(logs), "--inject",
                             "hang:rank=1,step=2", str(SCRIPT), "--steps", "50"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: list = []
    errs: list = []
    # stdout is read by _reader's thread only (communicate() beside it would take some lines)
    err_reader = threading.Thread(target=lambda: errs.extend(proc.stderr), daemon=True)
    err_reader.start()
    try:
        q = _reader(proc)
        m = _wait_for(q, r"\[rank 1\] dslaunch inject: hang:rank=1,step=2: rank 1 \(pid (\d+)\) "
                         r"hangs in _injected_hang at step 2", seen)
        os.kill(int(m.group(1)), signal.SIGUSR1)
        _wait_for(q, r"\[rank 1\] +File .*fault_injection\.py\", line \d+ in _injected_hang", seen)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err_reader.join(timeout=30)
    err = "".join(errs)
    assert proc.returncode == 143, err
    _drain(q, seen)
    out = "".join(seen)
    assert "[rank 0] STEP 0 2 " in out and "STEP 0 3 " not in out  # rank 0 waits for rank 1
    assert "[rank 1] STEP 1 2 " not in out  # stuck inside engine.step() of step 2
    assert "in _injected_hang" in (logs / "rank_1.log").read_text()
    assert_no_leftovers(marker)


def _has_watchdog() -> bool:
    return "--hang-timeout" in dslaunch("run", "--help", timeout=60).stdout


@pytest.mark.slow
def test_hang_is_reported_by_the_watchdog(tmp_path):
    if not _has_watchdog():
        pytest.skip("no --hang-timeout in this build (the hang watchdog is not there yet)")
    marker, env = marker_env()
    # 10 s: well above what imports take on a loaded machine (the watchdog is not under test here)
    r = dslaunch(*RUN, "--hang-timeout", 10, "--inject", "hang:rank=1,step=2", SCRIPT,
                 "--steps", 50, env=env, timeout=120)
    assert r.returncode != 0, r.stderr
    # the report names the stuck rank and the function it is stuck in (its stack)
    assert "rank 1 never entered all_reduce" in r.stderr and "in _injected_hang" in r.stderr
    assert_no_leftovers(marker)
