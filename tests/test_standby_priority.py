"""A standby process warms up at a lower CPU priority and takes its own back when promoted
(dslaunch/standby_priority.py): every thread, including one made while it was lowered. Where
the return is not allowed (no CAP_SYS_NICE, RLIMIT_NICE 0) it is never lowered."""

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
    start = os.getpriority(os.PRIO_PROCESS, 0)
    sp.lower()
    lowered, env = os.getpriority(os.PRIO_PROCESS, 0), os.environ.get(sp.NICE_ENV)
    tid, go = [], threading.Event()
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), go.wait()))
    t.start()
    while not tid:
        pass
    thread_lowered = os.getpriority(os.PRIO_PROCESS, tid[0])
    sp.restore()
    print(start, lowered, env, thread_lowered, os.getpriority(os.PRIO_PROCESS, 0),
          os.getpriority(os.PRIO_PROCESS, tid[0]), sp.NICE_ENV in os.environ)
    go.set()
""")


@pytest.mark.skipif(not standby_priority._may_raise_to(0), reason="needs CAP_SYS_NICE here")
def test_lowered_then_every_thread_restored():
    out = subprocess.run([sys.executable, "-c", ROUND_TRIP], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    start = int(out[0])
    assert out[1:] == [str(min(19, start + 10)), str(start), str(min(19, start + 10)),
                       str(start), str(start), "False"]


def test_not_lowered_where_it_could_not_come_back(monkeypatch):
    monkeypatch.setattr(standby_priority, "_may_raise_to", lambda nice: False)
    monkeypatch.delenv(standby_priority.NICE_ENV, raising=False)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    standby_priority.lower()
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert standby_priority.NICE_ENV not in os.environ
    standby_priority.restore()  # nothing to do
