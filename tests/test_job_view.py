"""The live job view and the straggler report (issue 23, part 4): the progress record's step and
collective timings (and a record of the first, shorter version still read), the straggler rule,
the table's columns, and one real job (``dslaunch run --monitor --log-dir``) with rank 1 slowed
by ``--inject slow``, looked at from outside with ``dslaunch top`` while it runs, asked for the
report with SIGUSR1, then ended."""

from __future__ import annotations

import io
import json
import signal
import struct
import subprocess
import time

import pytest

from dslaunch import progress_record
from dslaunch.launcher import jobview, stragglers
from dslaunch.launcher.live_table import COLUMNS, console, table
from helpers import DSLAUNCH, ROOT, SCRIPTS, dslaunch, rank_env


def test_record_times_steps_and_collectives_and_reads_the_first_version(tmp_path):
    w = progress_record.ProgressWriter(str(tmp_path / "p.bin"))
    w.step(1, tokens=32)
    w.enter("all_reduce", "world", 64)
    time.sleep(0.01)
    w.leave()
    w.step(2, tokens=64, device_mem=1234)
    rec = progress_record.read(str(tmp_path / "p.bin"))
    assert rec["coll_total"] > 0 and rec["step_coll"] == rec["coll_total"] == rec["step_coll_total"]
    assert rec["step_dt"] >= rec["step_coll"]  # the collective lies inside the step
    assert (rec["step"], rec["tokens"], rec["device_mem"], rec["last_op"]) == (2, 64, 1234, "all_reduce")
    r = jobview.rates(None, rec)  # the last step alone
    assert r["step_time"] == pytest.approx(r["compute"] + r["collectives"])

    # a writer of the first version: 224 bytes, no timing fields; they read as their defaults
    old = struct.pack(progress_record._FORMAT_V1, 2, 7, 1.0, 5, 2.0, 0, 0.0, 0, b"", b"", 3,
                      b"barrier", b"world", -1, 0.0, -1)
    assert len(old) == progress_record.SIZE_V1 == 224
    (tmp_path / "old.bin").write_bytes(old)
    rec = progress_record.read(str(tmp_path / "old.bin"))
    assert (rec["pid"], rec["step"], rec["last_op"], rec["tokens"], rec["step_dt"]) == (7, 5, "barrier", -1, 0.0)
    assert jobview.rates(None, rec)["step_time"] is None


def _row(rank, step_time, collectives):
    return {"rank": rank, "host": f"h{rank}", "step_time": step_time, "collectives": collectives,
            "compute": step_time - collectives, "first_step": 2, "last_step": 9}


def test_straggler_rule_names_the_slow_rank_and_where_its_time_goes():
    # lockstep: equal step times, rank 2 computes 0.3 s more and the others wait for it
    rows = [_row(0, 0.40, 0.30), _row(1, 0.40, 0.31), _row(2, 0.40, 0.01), _row(3, 0.40, 0.29)]
    [s] = stragglers.find(rows, 0.2)
    assert (s.rank, s.extra_in) == (2, "compute")
    text = stragglers.report(rows, 0.2)
    assert "straggler: rank 2 (h2): compute 390.0 ms per step" in text
    assert "its extra time is compute; the other ranks wait for it in collectives (300.0 ms" in text
    # not in lockstep: rank 1 steps slower because of its own collectives
    rows = [_row(0, 0.10, 0.02), _row(1, 0.30, 0.22), _row(2, 0.10, 0.02)]
    [s] = stragglers.find(rows, 0.2)
    assert (s.rank, s.extra_in) == (1, "collectives")
    # within the threshold: none
    rows = [_row(0, 0.40, 0.30), _row(1, 0.40, 0.29)]
    assert stragglers.find(rows, 0.2) == []
    assert "no straggler: every rank's compute per step is within 20% of the median" in \
        stragglers.report(rows, 0.2)


def test_table_has_the_columns():
    out = io.StringIO()
    rows = [{"rank": 0, "host": "node-a", "step": 7, "step_time": 0.25, "compute": 0.2,
             "collectives": 0.05, "tokens_per_s": 12345.0, "rss": 3 * 2 ** 30,
             "device_mem": 2 ** 30, "heartbeat_age": 0.4, "state": "in all_reduce"}]
    console(out, force_terminal=False).print(table(rows, "job"))
    text = out.getvalue()
    for name in COLUMNS:
        assert name in text
    for cell in ("node-a", "250.0 ms", "50.0 ms", "12,345", "RSS 3.0 GiB, GPU 1.0 GiB", "0.4 s ago",
                 "in all_reduce"):
        assert cell in text


def _wait_status(log_dir, ready, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = jobview.read_status(str(log_dir))
        if status is not None and ready(status):
            return status
        assert proc.poll() is None, "the job ended early"
        time.sleep(0.2)
    raise AssertionError(f"no such status within {timeout} s: {status}")


@pytest.mark.slow
def test_monitored_job_names_the_slowed_rank_live_and_at_the_end(tmp_path):
    log_dir, hold = tmp_path / "logs", tmp_path / "release"
    cmd = [*DSLAUNCH, "run", "--nproc-per-node", "2", "--omp-threads", "1", "--grace-period", "1",
           "--log-dir", str(log_dir), "--monitor", "--inject", "slow:rank=1,step=1,seconds=0.3",
           str(SCRIPTS / "monitor_train.py"), "--steps", "4", "--hold", str(hold)]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=rank_env(), stdout=out, stderr=err)
        try:
            # running, and both ranks several steps past the slow-down
            _wait_status(log_dir, lambda s: s["state"] == "running"
                         and all(r.get("steps", 0) >= 2 for r in s["job"]), proc)
            live = dslaunch("top", "--log-dir", log_dir, "--once")
            on_demand = dslaunch("top", "--log-dir", log_dir, "--stragglers")
            proc.send_signal(signal.SIGUSR1)  # the launcher prints the report too
            _wait_status(log_dir, lambda s: True, proc)
            time.sleep(1.5)  # the report is printed at the launcher's next tick
            hold.write_text("")
            assert proc.wait(timeout=180) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()

    # dslaunch top, beside the running job: every column, both ranks on this host, running
    assert live.returncode == 0, live.stderr
    assert "job running" in live.stdout
    for name in COLUMNS:
        assert name in live.stdout
    lines = [ln for ln in live.stdout.splitlines() if "localhost" in ln]
    assert len(lines) == 2 and "RSS" in lines[0] and "s ago" in lines[0]
    assert "straggler: rank 1 (localhost)" in on_demand.stdout, on_demand.stdout
    assert "its extra time is compute" in on_demand.stdout
    assert "rank 0" not in on_demand.stdout.split("straggler: ")[-1]

    # the launcher: the report on SIGUSR1 and at the end, the final table (not a terminal)
    assert stderr.count("dslaunch: straggler: rank 1 (localhost)") == 2, stderr
    assert "straggler: rank 0" not in stderr
    assert "dslaunch job: 2 ranks on 1 host(s), attempt 0: finished" in stdout
    for name in COLUMNS:
        assert name in stdout
    assert "[rank 0] DONE 0" in stdout and "[rank 1] DONE 1" in stdout

    # where the time goes: rank 1 computes (it sleeps), rank 0 waits for it in collectives
    final = json.loads((log_dir / "status.json").read_text())
    assert final["state"] == "finished"
    job = {r["rank"]: r for r in final["job"]}
    assert job[1]["compute"] > job[1]["collectives"] and job[0]["collectives"] > job[0]["compute"]
    assert job[0]["tokens_per_s"] > 0 and job[1]["tokens_per_s"] > 0


def test_last_status_keeps_each_ranks_last_known_memory():
    """A rank caught between its exit and its reaping is a zombie, whose resident memory reads 0
    (the cause of a status.json that gave rank 0 an RSS of 0 at the end of a short job): the
    agent reports no figure then, and the view keeps the last one it had."""
    import psutil

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process(child.pid).memory_info().rss == 0  # the zombie's figure
    child.wait()
    view = jobview.JobView({0: "h1", 1: "h2"})
    beat = {"event": "heartbeat", "idle": {"0": 0.1, "1": 0.1}, "rss": {"0": 1000, "1": 2000}}
    view.event(beat, 1.0)
    view.event(dict(beat, rss={"0": 0}), 2.0)  # an old agent's zero, and rank 1 reported none
    view.event({"event": "exit", "rank": 0, "returncode": 0}, 2.5)
    rows = {r["rank"]: r for r in view.live(3.0)}
    assert (rows[0]["rss"], rows[1]["rss"]) == (1000, 2000)
