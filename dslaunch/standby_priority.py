"""A standby process (in-process recovery: ``launcher/agent_recovery.py`` starts one per node ahead
of any fault) warms up at a lower CPU priority, so that on a host with few cores its imports and
engine warm-up give way to the ranks' own start and training; promoted to a rank, it takes back
the priority it started with.

Two levers, because Linux has two:

- **Its autogroup.** With ``kernel.sched_autogroup_enabled`` (the default on most distributions)
  the scheduler first shares the CPU between sessions, whatever their threads' niceness; the
  agent starts every rank and the standby in a session of its own, so only the session's
  niceness (``/proc/self/autogroup``) makes the standby give way. Any process may set its own
  autogroup to a niceness of 0 or more, so the return always works.
- **Its threads' niceness**, which decides where autogroups are off. Raising a priority again
  needs CAP_SYS_NICE or an RLIMIT_NICE that permits it; without either the threads are not
  lowered, since a promoted rank stuck at a lower priority would straggle.

No torch here: the bootstrap calls ``lower`` before the script.
"""

from __future__ import annotations

import os
import resource
import time

NICE_ENV = "DSLAUNCH_STANDBY_NICE_FROM"  # the threads' niceness to return to (set while lowered)
GROUP_ENV = "DSLAUNCH_STANDBY_AUTOGROUP_FROM"  # the autogroup's (set while lowered)
STEP_ENV = "DSLAUNCH_STANDBY_NICE"  # how much lower (0: not at all)
STEP = 10  # the default: niceness + 10, a CFS weight about 1/10 of a rank's
CAP_SYS_NICE = 23
AUTOGROUP = "/proc/self/autogroup"
AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"


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


def _autogroup_nice() -> int | None:
    """This session's autogroup niceness; None where autogroups are off or not built."""
    try:
        with open(AUTOGROUP_SWITCH) as f:
            if f.read().strip() != "1":
                return None
        with open(AUTOGROUP) as f:  # "/autogroup-123 nice 0"
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup_nice(nice: int) -> bool:
    for _ in range(3):  # the kernel allows one change per 100 ms without CAP_SYS_ADMIN
        try:
            with open(AUTOGROUP, "w") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:
            time.sleep(0.11)
        except OSError:
            return False
    return False


def _step() -> int:
    try:
        return max(0, int(os.environ.get(STEP_ENV, STEP)))
    except ValueError:
        return STEP


def lower() -> None:
    """The standby's start: its autogroup and its threads ``STEP`` lower where each may come back."""
    step = _step()
    if not step:
        return
    # (the session is the standby's own only when it leads it, as the agent starts it)
    group = _autogroup_nice() if os.getsid(0) == os.getpid() else None
    if group is not None and group >= 0 and _set_autogroup_nice(min(19, group + step)):
        os.environ[GROUP_ENV] = str(group)
    try:
        start = os.getpriority(os.PRIO_PROCESS, 0)
        if start < 19 and _may_raise_to(start):
            os.setpriority(os.PRIO_PROCESS, 0, min(19, start + step))
            os.environ[NICE_ENV] = str(start)
    except OSError:
        pass


def restore() -> None:
    """Promoted: the autogroup and every thread back to where the standby started (Linux keeps a
    niceness per thread; threads made after this inherit the main thread's)."""
    group = os.environ.pop(GROUP_ENV, None)
    if group is not None:
        _set_autogroup_nice(int(group))
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
