"""A standby process warms up at a lower CPU priority and takes its own back when promoted
(dslaunch/standby_priority.py): its session's autogroup (where the kernel has autogroups) and
every thread, including one made while it was lowered. Where the threads' return is not allowed
(no CAP_SYS_NICE, RLIMIT_NICE 0) they are never lowered; a process that does not lead its session
leaves the session's autogroup alone."""

import os
import subprocess
import sys
import textwrap

import pytest

from dslaunch import standby_priority
from helpers import ROOT

ROUND_TRIP = textwrap.dedent("""
    import os, threading
    from dslaunch import standby_priority as sp
    def group():
        g = sp._autogroup_nice()
        return "none" if g is None else str(g)
    start, group0 = os.getpriority(os.PRIO_PROCESS, 0), group()
    sp.lower()
    lowered, group1 = os.getpriority(os.PRIO_PROCESS, 0), group()
    tid, go = [], threading.Event()
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), go.wait()))
    t.start()
    while not tid:
        pass
    thread_lowered = os.getpriority(os.PRIO_PROCESS, tid[0])
    sp.restore()
    print(start, lowered, thread_lowered, os.getpriority(os.PRIO_PROCESS, 0),
          os.getpriority(os.PRIO_PROCESS, tid[0]), group0, group1, group(),
          sp.NICE_ENV in os.environ or sp.GROUP_ENV in os.environ)
    go.set()
""")


def _round_trip(own_session: bool) -> list:
    return subprocess.run([sys.executable, "-c", ROUND_TRIP], capture_output=True, text=True,
                          check=True, start_new_session=own_session,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()


@pytest.mark.skipif(not standby_priority._may_raise_to(0), reason="needs CAP_SYS_NICE here")
def test_lowered_then_every_thread_and_the_autogroup_restored():
    start, lowered, thread_lowered, back, thread_back, group0, group1, group2, left = \
        _round_trip(own_session=True)
    low = str(min(19, int(start) + 10))
    assert (lowered, thread_lowered, back, thread_back, left) == (low, low, start, start, "False")
    if group0 != "none":  # autogroups on: the standby's session gives way, then comes back
        assert (group1, group2) == (str(min(19, int(group0) + 10)), group0)


def test_a_process_that_does_not_lead_its_session_leaves_the_autogroup_alone():
    *_, group0, group1, group2, _ = _round_trip(own_session=False)
    assert group0 == group1 == group2


def test_not_lowered_where_it_could_not_come_back(monkeypatch):
    monkeypatch.setattr(standby_priority, "_may_raise_to", lambda nice: False)
    monkeypatch.setattr(standby_priority, "_autogroup_nice", lambda: None)
    monkeypatch.delenv(standby_priority.NICE_ENV, raising=False)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    standby_priority.lower()
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert standby_priority.NICE_ENV not in os.environ
    standby_priority.restore()  # nothing to do
