"""Ctrl-C at the launcher stops every rank on every host; --log-dir gets one file per rank on the
launching host, remote ranks included."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
from test_runners import RUNNER_ENV

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["ssh", "openmpi"])
def test_ctrl_c_stops_everything_everywhere(cluster, jobdir, launcher):
    import os

    hf = cluster.hostfile(jobdir / "hostfile")
    logs = jobdir / "logs"
    argv = [sys.executable, "-c", "from dslaunch.cli import main; main()", "run", "-H", str(hf),
            "--launcher", launcher, "--grace-period", "2", "--log-dir", str(logs), "sleepy.py"]
    proc = subprocess.Popen(argv, cwd=jobdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **RUNNER_ENV.get(launcher, {})})
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
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends the launcher
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT): stopped all 4 ranks" in err
    assert "NOT STOPPED" not in "".join(out)
    cluster.assert_clean(jobdir)
    for r in range(4):
        text = (logs / f"rank_{r}.log").read_text()
        assert f"READY {r}\n" in text and "[host" not in text  # the file has the rank's own lines
