"""The hang watchdog across hosts (ssh launcher, 2 hosts x 2 ranks): rank 3 on host2, alive but
stuck after an all_reduce, is reported with its host and the function it sits in; the job stops
and nothing of it is left on any host. Once through dslaunch.comm, once from a plain
torch.distributed script that imports no dslaunch (the bootstrap records its collectives)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
DSLAUNCH = [sys.executable, "-c", "from dslaunch.cli import main; main()"]  # as conftest's


def test_stuck_rank_on_host2_is_reported(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--hang-timeout", "4",
                           "--grace-period", "2", "stuck.py", cwd=jobdir, timeout=120)
    out, err = res.stdout, res.stderr
    assert res.returncode == 1, out[-2000:] + err[-2000:]
    for r in range(4):
        assert f"READY {r}" in out, err[-3000:]
    assert "NOT STOPPED" not in out
    assert "ranks 0-2 (host1,host2) wait in all_reduce #2 on world, 8 B" in err
    assert "rank 3 (host2): not in a collective; last all_reduce #1 on world" in err
    assert "in wait_for_lock" in err  # its stack, fetched from host2
    assert ("job failed: hang: rank 3 never entered all_reduce #2 on world that ranks 0-2 wait "
            "in; rank 3 is in wait_for_lock (stuck.py:13)") in err
    cluster.assert_clean(jobdir)


def test_plain_torch_rank_stuck_on_host2_is_named_within_the_timeout(cluster, jobdir):
    timeout = 10
    hf = cluster.hostfile(jobdir / "hostfile")
    proc = subprocess.Popen([*DSLAUNCH, "run", "-H", str(hf), "--launcher", "ssh",
                             "--hang-timeout", str(timeout), "--grace-period", "2",
                             "plain_stuck.py"], cwd=jobdir, env=dict(os.environ), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list = []

    def pump(stream, name):
        for line in stream:
            lines.append((time.monotonic(), name, line.rstrip("\n")))

    pumps = [threading.Thread(target=pump, args=(s, n))
             for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for p in pumps:
        p.start()
    try:
        rc = proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pumps:
            p.join()
    out = "\n".join(text for _, n, text in lines if n == "out")
    err = "\n".join(text for _, n, text in lines if n == "err")
    assert rc == 1, out[-2000:] + err[-2000:]
    ready = [t for t, n, text in lines if n == "out" and "READY" in text]
    assert len(ready) == 4 and "NOT STOPPED" not in out
    report_at = next(t for t, n, text in lines if n == "err" and "hang watchdog: no rank" in text)
    assert report_at - max(ready) <= timeout + 10
    assert "ranks 0-2 (host1,host2) wait in all_reduce #2 on world, 8 B" in err
    assert "rank 3 (host2): not in a collective; last all_reduce #1 on world" in err
    assert ("job failed: hang: rank 3 never entered all_reduce #2 on world that ranks 0-2 wait "
            "in; rank 3 is in wait_for_data (plain_stuck.py:11)") in err
    cluster.assert_clean(jobdir)
