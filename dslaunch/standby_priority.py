"""A standby process (in-process recovery: ``launcher/agent.py`` starts one per node ahead of any
fault) warms up at a lower CPU priority, so that on a host with few cores its imports and engine
warm-up give way to the ranks' own start and training; promoted to a rank, it takes back the
priority it started with, on every thread it has.

Only where that return is allowed: raising a priority again needs CAP_SYS_NICE or an RLIMIT_NICE
that permits it. Without either the standby keeps its priority throughout, since a rank stuck
at a lower one would straggle. No torch here: the bootstrap calls ``lower`` before the script.
"""

from __future__ import annotations

import os
import resource

NICE_ENV = "DSLAUNCH_STANDBY_NICE_FROM"  # the priority to return to (set while lowered)
STEP_ENV = "DSLAUNCH_STANDBY_NICE"  # how much lower (0: not at all)
STEP = 10  # the default: niceness + 10, a CFS weight about 1/10 of a rank's
CAP_SYS_NICE = 23


def _may_raise_to(nice: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
        if int(caps, 16) >> CAP_SYS_NICE & 1:
            return True
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= nice


def lower() -> None:
    """The standby's start: niceness up by ``STEP`` where it may come back down later."""
    try:
        start = os.getpriority(os.PRIO_PROCESS, 0)
        target = min(19, start + max(0, int(os.environ.get(STEP_ENV, STEP))))
        if target == start or not _may_raise_to(start):
            return
        os.setpriority(os.PRIO_PROCESS, 0, target)
    except (OSError, ValueError):
        return
    os.environ[NICE_ENV] = str(start)


def restore() -> None:
    """Promoted: every thread back to the priority the standby started with (Linux keeps a
    niceness per thread; threads made after this inherit the main thread's)."""
    start = os.environ.pop(NICE_ENV, None)
    if start is None:
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, int(start))
        except OSError:
            pass
