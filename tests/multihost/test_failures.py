"""Fail fast across hosts: a rank failing on host2 stops host1's ranks, with its traceback shown; a
host that goes silent (link down, then every process killed: a power loss) ends the job naming it;
nothing of the job is left on any host afterwards."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from test_runners import RUNNER_ARGS, RUNNER_ENV

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi", "mpich", "slurm"])
def test_rank_failure_on_host2_stops_host1(request, cluster, jobdir, launcher):
    hf = cluster.hostfile(jobdir / "hostfile")
    prefix = None
    if launcher == "slurm":
        request.getfixturevalue("slurm")
        prefix = ["salloc", "--quiet", "-N2", "-w", "host1,host2", "--ntasks-per-node=2"]
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", launcher, "--grace-period", "2",
                           *RUNNER_ARGS.get(launcher, []), "fail.py", cwd=jobdir,
                           env=RUNNER_ENV.get(launcher), prefix=prefix, timeout=180)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    for r in range(4):
        assert f"READY {r}" in res.stdout  # all four really ran before the failure
    assert "NOT STOPPED" not in res.stdout
    err = res.stderr
    assert "job failed: rank 3 (host host2) exited with code 1: ValueError: boom on purpose from rank 3" in err
    assert re.search(r"traceback \(last lines\):\n.*Traceback \(most recent call last\)", err, re.S)
    assert 'File "fail.py", line 11, in <module>' in err
    cluster.assert_clean(jobdir)


def test_silent_host_loss_ends_job_naming_host(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    argv = [sys.executable, "-c", "from dslaunch.cli import main; main()", "run", "-H", str(hf),
            "--launcher", "ssh", "--heartbeat-timeout", "5", "--grace-period", "2", "sleepy.py"]
    proc = subprocess.Popen(argv, cwd=jobdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            out.append(line)
            if sum("READY" in ln for ln in out) == 4:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(120), "ranks never got ready:\n" + "".join(out)
        cluster.host_down("host2")  # link down first: no FIN/RST leaves; then everything killed
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("launcher still running 60 s after host2 went silent")
        err = proc.stderr.read()
        assert proc.returncode == 1, err
        assert "job failed: host host2 (node 1) lost: no heartbeat for 5 s" in err
        assert "NOT STOPPED" not in "".join(out)
        # the surviving host's agent was told to stop: nothing of the job left on host1 or here
        cluster.assert_clean(jobdir, hosts=["host1"])
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.host_up("host2")
    cluster.assert_clean(jobdir, hosts=["host2"], wait=10)  # revived: only its daemons again
