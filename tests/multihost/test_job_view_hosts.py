"""The live job view across hosts (fake hosts, ssh): one rank on each of host1 and host2, the one
on host2 slowed by ``--inject slow``. Each host's agent carries its rank's progress and memory in
its heartbeats; the straggler report names host2's rank, and the table shows both hosts."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from helpers import ROOT, SCRIPTS

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _python(jobdir):
    """The agents' interpreter: this venv's, importing dslaunch from this checkout (an ssh
    session does not carry PYTHONPATH)."""
    py = jobdir / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
    os.chmod(py, 0o755)
    return str(py)


def test_straggler_on_another_host_is_named(cluster, jobdir):
    shutil.copy(SCRIPTS / "monitor_train.py", jobdir / "monitor_train.py")
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1, "host2": 1})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--python", _python(jobdir),
                           "--grace-period", "2", "--omp-threads", "1", "--monitor",
                           "--log-dir", str(jobdir / "logs"),
                           "--inject", "slow:rank=1,step=1,seconds=0.3",
                           "monitor_train.py", "--steps", "8", cwd=jobdir, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dslaunch: straggler: rank 1 (host2)" in res.stderr, res.stderr[-3000:]
    assert "its extra time is compute" in res.stderr and "straggler: rank 0" not in res.stderr
    assert "dslaunch job: 2 ranks on 2 host(s), attempt 0: finished" in res.stdout
    status = json.loads((jobdir / "logs" / "status.json").read_text())
    rows = {r["rank"]: r for r in status["ranks"]}
    assert (rows[0]["host"], rows[1]["host"]) == ("host1", "host2")
    assert rows[0]["rss"] > 0 and rows[1]["rss"] > 0  # each from its own host's agent
    cluster.assert_clean(jobdir)
