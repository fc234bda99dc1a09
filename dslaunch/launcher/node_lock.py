"""The node lock: one file an agent holds locked while it lives, per (job, host, node), so the
agent of the next attempt of the same node starts no rank while the previous attempt's ranks there
still run (``agent.py`` takes it before starting ranks)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time

from dslaunch.launcher.plan import WorldPlan


def node_lock_path(plan: WorldPlan, node_rank: int) -> str:
    """The file an agent holds locked while it lives, one per (job, host, node): the agent of the
    next attempt of the same node takes it before starting ranks."""
    key = f"{plan.run_id}|{plan.node(node_rank)['host']}|{node_rank}|{plan.master_port}"
    name = hashlib.sha1(key.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"dslaunch-node-{name}.lock")


def node_lock(path: str, wait: float, on_wait=None):
    """Lock ``path`` (flock, released by the kernel when this process ends, even by SIGKILL).
    A restart must not start ranks on a node while the previous attempt's ranks there still run:
    with pdsh the launcher's stop closes the connections and the attempt is over for the
    launcher at once, while each remote agent is still stopping its ranks (EOF on stdin ->
    SIGTERM, grace period, SIGKILL), so the next attempt's rank 0 met the old rank 0 still
    holding MASTER_PORT (or the old store answering the new ranks). The old agent exits only
    after its ranks are gone, so holding its lock means they are. Returns (fd, seconds waited,
    got it); after ``wait`` s it gives up waiting and returns got=False (the caller goes on)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    start = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, time.monotonic() - start, True
        except BlockingIOError:
            pass
        if not told and on_wait is not None:
            on_wait()
            told = True
        if time.monotonic() - start > wait:
            return fd, time.monotonic() - start, False
        time.sleep(0.05)
