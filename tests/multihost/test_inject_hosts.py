"""`dslaunch run --inject` host faults on the fake hosts (2 hosts x 2 ranks, ssh): host-down makes
host2's agent kill its ranks and go silent, link-down cuts host2's network; either way the launcher
declares host2 lost and nothing of the job is left on any host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, SCRIPTS

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

STEP = 5  # the ranks report their steps (dslaunch.inject.tick): host2's agent acts at this one


def _python(jobdir):
    """The agents' interpreter: this venv's, importing dslaunch from this checkout (an ssh
    session does not carry PYTHONPATH, and the venv's install may point at another checkout)."""
    py = jobdir / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
    os.chmod(py, 0o755)
    return str(py)


def _job(cluster, jobdir, spec):
    shutil.copy(SCRIPTS / "inject_train.py", jobdir / "inject_train.py")
    hf = cluster.hostfile(jobdir / "hostfile")
    return cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--heartbeat-timeout", "3",
                            "--python", _python(jobdir),
                            "--grace-period", "2", "--omp-threads", "1", "--inject", spec,
                            "inject_train.py", "--plain", "--steps", "100000", "--step-sleep", "0.1",
                            cwd=jobdir, timeout=120)


def test_host_down_is_reported_as_a_lost_host(cluster, jobdir):
    res = _job(cluster, jobdir, f"host-down:host=host2,step={STEP}")
    assert res.returncode == 1, res.stderr[-3000:]
    assert f"[host2:3] STEP 3 {STEP} " in res.stdout  # host2 trained up to the fault
    assert f"inject host-down:host=host2,step={STEP}: killing this host's ranks" in res.stderr
    assert "job failed: host host2 (node 1) lost: no heartbeat for 3 s" in res.stderr
    assert "DONE" not in res.stdout
    cluster.assert_clean(jobdir)


def test_link_down_is_reported_as_a_lost_host(cluster, jobdir):
    try:
        res = _job(cluster, jobdir, f"link-down:host=host2,step={STEP}")
        assert res.returncode == 1, res.stderr[-3000:]
        assert "[host2:3] STEP 3 " in res.stdout
        assert "job failed: host host2 (node 1) lost: no heartbeat for 3 s" in res.stderr
    finally:
        # host2's ranks and agent are cut off, not dead: end them as a power cut would, then
        # bring its interface (the agent took it down from inside) and its sshd back
        cluster.host_down("host2")
        subprocess.run(["ip", "netns", "exec", "dsl-host2", "ip", "link", "set", "eth0", "up"],
                       check=True, timeout=30)
        cluster.host_up("host2")
    cluster.assert_clean(jobdir)  # host1 and this host too (host2's cut-off agent counted here before)
