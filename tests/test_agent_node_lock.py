"""The agent's node lock (launcher/node_lock.py): a restarted agent starts no rank on a
node while the previous attempt's agent there still lives (it exits only after its ranks are
gone). The pdsh flake of tests/multihost/test_restarts.py: with pdsh the launcher's stop ends the
attempt at once (the connections close), while each remote agent is still stopping its ranks, so
the next attempt's rank 0 met the old rank 0 still on MASTER_PORT. Real processes, real flock;
no timing asserted."""

import os
import signal
import subprocess
import sys

from dslaunch.launcher.node_lock import node_lock, node_lock_path
from dslaunch.launcher.plan import build_plan

HOLDER = """
import sys, time
from dslaunch.launcher.node_lock import node_lock
fd, waited, got = node_lock(sys.argv[1], 5.0)
print("held" if got else "not held", flush=True)
time.sleep(600)
"""


def test_lock_waits_for_the_previous_holder_to_end(tmp_path):
    path = str(tmp_path / "node.lock")
    old = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert old.stdout.readline().strip() == "held"
        fd, _, got = node_lock(path, 0.0)  # the old agent lives: not ours
        assert not got
        os.close(fd)
        os.kill(old.pid, signal.SIGKILL)  # even a killed agent releases it (the kernel does)
        old.wait()
        fd, _, got = node_lock(path, 30.0)
        assert got
        os.close(fd)
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


def test_lock_key_is_per_job_and_node_kept_across_restarts():
    plan = build_plan({"h1": [0, 1], "h2": [0, 1]}, program=["t.py"], launcher="pdsh")
    assert node_lock_path(plan, 0) != node_lock_path(plan, 1)
    other = build_plan({"h1": [0, 1], "h2": [0, 1]}, program=["t.py"], launcher="pdsh")
    assert node_lock_path(plan, 0) != node_lock_path(other, 0)  # another job (run id, port)
    assert node_lock_path(plan, 0) == node_lock_path(plan, 0)  # the same for every attempt
