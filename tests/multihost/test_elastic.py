"""Elastic restarts across fake hosts: a host powered off mid-training (link down, then every
process on it killed) is excluded and the job finishes on the others, resuming from its last
checkpoint (on fewer ranks, or on a spare with the same world size); too few hosts left is a
clear refusal; a crash loop stops with its own exit code. Each handled fault leaves a record in
incidents.jsonl, and nothing of the job is left on any host."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from dslaunch.launcher import incidents
from dslaunch.launcher.elastic import CRASH_LOOP_EXIT, NO_HOSTS_EXIT

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 1}}
SAVE_EVERY = 4
ALL = ["host1", "host2", "host3", "host4"]


class Job:
    """The real CLI, its output read as it comes; ``wait_for(text)`` blocks until a line of
    stdout or stderr has it."""

    def __init__(self, cluster, jobdir, *args):
        argv = [sys.executable, "-c", "from dslaunch.cli import main; main()", "run", *args]
        self.proc = subprocess.Popen(argv, cwd=jobdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list = []
        self.err_lines: list = []
        self.cond = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(s, to), daemon=True)
                        for s, to in ((self.proc.stdout, self.lines),
                                      (self.proc.stderr, self.err_lines))]
        for t in self.readers:
            t.start()

    def _read(self, stream, into):
        for line in stream:
            with self.cond:
                into.append(line)
                self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: any(text in ln for ln in self.lines + self.err_lines),
                                      timeout):
                pytest.fail(f"never printed {text!r}:\n" + "".join(self.lines[-40:])
                            + "".join(self.err_lines[-20:]))

    def finish(self, timeout: float = 150) -> tuple:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("launcher still running:\n" + "".join(self.lines[-40:]))
        for t in self.readers:
            t.join(10)
        return self.proc.returncode, "".join(self.lines), "".join(self.err_lines)


def train_job(cluster, jobdir, hosts: dict, *extra, steps=16):
    hf = jobdir / "hostfile"
    hf.write_text("".join(f"{h} slots={n}\n" if isinstance(n, int) else f"{h} {n}\n"
                          for h, n in hosts.items()))
    (jobdir / "c.json").write_text(json.dumps(CONFIG))
    return Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
               "--config", "c.json", "--log-dir", str(jobdir / "logs"), *extra,
               "elastic_train.py", str(jobdir / "ckpt"), "--steps", str(steps),
               "--save-every", str(SAVE_EVERY), "--sleep", "0.25")


def lose_host_mid_training(cluster, job, host):
    job.wait_for(f"SAVED {SAVE_EVERY}")
    cluster.host_down(host)


def check_resumed(out: str, records: list, host: str, world_after: int, steps: int) -> dict:
    assert f"RESTART 1 WORLD {world_after}" in out, out[-3000:]
    assert f"FINISHED {steps} WORLD {world_after} RESTART 1" in out
    rec = records[0]
    assert rec["detector"] == "liveness" and rec["culprit_host"] == host, rec
    assert rec["kind"] == "lost" and host in rec["excluded_hosts"]
    assert rec["action"] == "restart" and rec["world_size_after"] == world_after
    # resumed from the checkpoint before the fault: at most one save interval redone
    resumed = int(out.split("RESUMED ")[-1].split()[0])
    assert resumed >= SAVE_EVERY and rec["resumed_from"] == resumed
    assert 0 <= rec["steps_redone"] <= SAVE_EVERY
    assert rec["seconds_to_training"] > 0
    assert rec["detect_seconds"] is not None and rec["replan_seconds"] is not None
    return rec


def test_lost_host_job_finishes_on_the_others(cluster, jobdir):
    job = train_job(cluster, jobdir, {"host1": 1, "host2": 1, "host4": 1},
                    "--nnodes", "2:3", "--max-restarts", "2")
    try:
        lose_host_mid_training(cluster, job, "host2")
        rc, out, err = job.finish()
    finally:
        cluster.host_up("host2")
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "excluding host host2 from the next attempts: no heartbeat for 5 s" in err
    assert "restarting the whole job (restart 1 of 2)" in err and "on host1, host4 (world size 3 -> 2)" in err
    records = incidents.read(str(jobdir / "logs" / "incidents.jsonl"))
    assert len(records) == 1
    check_resumed(out, records, "host2", 2, 16)
    assert "run summary: 1 fault(s) handled in 2 attempt(s)" in err
    assert "host2 at attempt 0 (no heartbeat for 5 s)" in err
    cluster.assert_clean(jobdir, hosts=ALL)


def test_spare_keeps_the_world_size(cluster, jobdir):
    job = train_job(cluster, jobdir, {"host1": 1, "host2": 1, "host4": "slots=1 spare"},
                    "--max-restarts", "1")
    try:
        lose_host_mid_training(cluster, job, "host1")  # the master's host: it moves to host2
        rc, out, err = job.finish()
    finally:
        cluster.host_up("host1")
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "on host2, host4 (world size 2 -> 2)" in err
    records = incidents.read(str(jobdir / "logs" / "incidents.jsonl"))
    rec = check_resumed(out, records, "host1", 2, 16)
    assert rec["world_size_before"] == 2
    cluster.assert_clean(jobdir, hosts=ALL)


def test_fewer_than_min_hosts_is_refused(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1, "host2": 1})
    job = Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
              "--nnodes", "2", "--max-restarts", "3", "sleepy.py")
    try:
        job.wait_for("READY 1")
        cluster.host_down("host2")
        rc, out, err = job.finish()
    finally:
        cluster.host_up("host2")
    assert rc == NO_HOSTS_EXIT, err[-3000:]
    assert ("not restarting: only 1 host(s) can run the job (host1), fewer than the minimum 2 of "
            "--nnodes; excluded: host2 (no heartbeat for 5 s)") in err
    assert "restarting the whole job" not in err and "NOT STOPPED" not in out
    rec = incidents.read(str(jobdir / "dslaunch-logs" / "incidents.jsonl"))[0]
    assert rec["action"] == "stop" and rec["exit_code"] == NO_HOSTS_EXIT
    cluster.assert_clean(jobdir, hosts=ALL)


def test_crash_loop_stops_with_its_own_exit_code(cluster, jobdir):
    (jobdir / "crash.py").write_text(
        "import os, sys\n"
        "print('ATTEMPT', os.environ['DSLAUNCH_RESTART_COUNT'], 'RANK', os.environ['RANK'])\n"
        "sys.exit(1 if os.environ['RANK'] == '1' else 0)\n")
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1, "host2": 1})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--grace-period", "1",
                           "--max-restarts", "6", "crash.py", cwd=jobdir, timeout=150)
    assert res.returncode == CRASH_LOOP_EXIT, res.stderr[-3000:]
    assert "not restarting: crash loop: 3 restarts in a row made no progress" in res.stderr
    assert "ATTEMPT 3 RANK 1" in res.stdout and "ATTEMPT 4" not in res.stdout
    records = incidents.read(str(jobdir / "dslaunch-logs" / "incidents.jsonl"))
    assert [r["action"] for r in records] == ["restart"] * 3 + ["stop"]
    assert records[-1]["exit_code"] == CRASH_LOOP_EXIT and records[-1]["detector"] == "exit"
    assert all(r["culprit_rank"] == 1 and r["culprit_host"] == "host2" for r in records)
    assert records[0]["excluded_hosts"] == {}  # host2 is kept: the job cannot go on without it
    cluster.assert_clean(jobdir, hosts=ALL)
