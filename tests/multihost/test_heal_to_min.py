"""Healing down to MIN hosts (issue: "a 2-host job heals onto 1 host when MIN is 1"), made safe
by fencing: over ssh the controller pings every agent, and an agent that hears nothing for the
heartbeat timeout kills its own ranks, so the half of a split network the controller cannot
reach stops training before the job restarts elsewhere; the majority rule is then not needed
(elastic.py says where it still applies: runners without a channel to each agent).

- host2 powered off (link down + every process killed): the job finishes on host1 alone, from
  its last checkpoint;
- host2 cut off but alive (link down only, a split): its agent kills its ranks and exits on its
  own, before the launcher starts the next attempt on host1, which finishes; once the link is back
  nothing of the job is left anywhere.
"""

from __future__ import annotations

import time

import pytest
from test_elastic import ALL, SAVE_EVERY, check_resumed, train_job

from dslaunch.launcher import incidents

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
HEARTBEAT_TIMEOUT = 5.0  # the launcher's default (controller.HEARTBEAT_TIMEOUT)


def _pythons(cluster, host) -> list:
    """The job's Python processes (agent, ranks) on ``host``."""
    import psutil

    found = []
    for pid in cluster.job_pids(host):
        try:
            if "python" in " ".join(psutil.Process(pid).cmdline()):
                found.append(pid)
        except psutil.Error:
            pass
    return found


def _heals_onto_host1(out, err, jobdir, host="host2"):
    assert "not restarting" not in err, err[-3000:]
    assert "on host1 (world size 4 -> 2)" in err, err[-3000:]
    records = incidents.read(str(jobdir / "logs" / "incidents.jsonl"))
    assert len(records) == 1
    check_resumed(out, records, host, 2, 16)


def test_powered_off_host_heals_onto_the_one_left(cluster, jobdir):
    job = train_job(cluster, jobdir, {"host1": 2, "host2": 2}, "--nnodes", "1:2",
                    "--max-restarts", "2")
    try:
        job.wait_for(f"SAVED {SAVE_EVERY}")
        cluster.host_down("host2")
        rc, out, err = job.finish()
    finally:
        cluster.host_up("host2")
    assert rc == 0, out[-3000:] + err[-3000:]
    _heals_onto_host1(out, err, jobdir)
    cluster.assert_clean(jobdir, hosts=ALL)


def test_split_off_host_fences_itself_before_the_job_goes_on(cluster, jobdir):
    job = train_job(cluster, jobdir, {"host1": 2, "host2": 2}, "--nnodes", "1:2",
                    "--max-restarts", "2")
    healed = False
    try:
        job.wait_for(f"SAVED {SAVE_EVERY}")
        assert _pythons(cluster, "host2")  # its agent and ranks run
        cluster.split("host2")
        split_at = time.monotonic()
        while _pythons(cluster, "host2") and time.monotonic() < split_at + HEARTBEAT_TIMEOUT + 10:
            time.sleep(0.1)
        gone_after = time.monotonic() - split_at
        left = _pythons(cluster, "host2")
        # fenced before the launcher went on without it (the host is still cut off)
        restarted = any("restarting the whole job" in ln for ln in job.err_lines)
        job.wait_for("excluding host host2")  # the launcher's side of the split, then heal it
        cluster.split("host2", heal=True)
        healed = True
        rc, out, err = job.finish()
    finally:
        if not healed:
            cluster.split("host2", heal=True)
    assert not left, f"host2 still runs {left} {gone_after:.1f} s after the split"
    assert not restarted
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "fencing: no word from the launcher" not in err  # host2's agent could not tell us
    _heals_onto_host1(out, err, jobdir)
    cluster.assert_clean(jobdir, hosts=ALL)
