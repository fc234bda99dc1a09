"""The hang watchdog's logic (dslaunch/launcher/watchdog.py), driven with heartbeat events as the
agents send them; times are given, so nothing here waits."""

from __future__ import annotations

from dslaunch.launcher import watchdog
from dslaunch.launcher.watchdog import Watchdog, group_members, main_thread_frames, where

HOSTS = {0: "host1", 1: "host1", 2: "host2", 3: "host2"}

STACK_LOCK = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 88 in wait_for_lock
  File "/job/train.py", line 95 in main
  File "/job/train.py", line 99 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/venv/site-packages/dslaunch/launcher/bootstrap.py", line 130 in main
"""

STACK_COLLECTIVE = """Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2500 in all_gather
  File "/src/dslaunch/engine/comm/collectives.py", line 300 in _run
  File "/job/train.py", line 40 in step
  File "/job/train.py", line 99 in <module>
"""


def rec(step=-1, op="", group="", seq=0, nbytes=0, since=0.0, last=("", "", 0)):
    return {"step": step, "coll_op": op, "coll_group": group, "coll_seq": seq,
            "coll_bytes": nbytes, "coll_since": since, "last_op": last[0], "last_group": last[1],
            "last_seq": last[2]}


def heartbeat(node, idle: dict, progress: dict, t=1000.0):
    return {"event": "heartbeat", "node_rank": node, "time": t,
            "idle": {str(k): v for k, v in idle.items()},
            "progress": {str(k): v for k, v in progress.items()}}


def feed_stuck_rank3(w: Watchdog, now: float, idle: float) -> None:
    """Ranks 0-2 wait in all_reduce #2 on world; rank 3 completed #1 and sits elsewhere."""
    waiting = rec(step=0, op="all_reduce", group="world", seq=2, nbytes=4, since=1000.0 - idle,
                  last=("all_reduce", "world", 1))
    w.event(heartbeat(0, {0: idle, 1: idle}, {0: waiting, 1: waiting}), now)
    w.event(heartbeat(1, {2: idle, 3: idle + 0.5},
                      {2: waiting, 3: rec(step=0, last=("all_reduce", "world", 1))}), now)


def test_stuck_rank_is_named_with_its_function_after_the_timeout():
    w = Watchdog(3.0, HOSTS, now=0.0)
    feed_stuck_rank3(w, now=10.0, idle=2.0)
    assert w.poll(10.0) is None  # 2 s idle < 3 s
    assert w.poll(10.9) is None
    dump = w.poll(11.1)  # 3.1 s idle for every rank
    assert dump.kind == "dump" and dump.verdict == "hang" and dump.ranks == [3]
    assert w.poll(11.2) is None  # waiting for the stack (up to STACK_WAIT)
    w.event({"event": "stacks", "node_rank": 1, "stacks": {"3": {"python": STACK_LOCK}}}, 11.3)
    report = w.poll(11.3)
    assert report.kind == "report"
    assert report.headline == ("rank 3 never entered all_reduce #2 on world that ranks 0-2 wait "
                               "in; rank 3 is in wait_for_lock (train.py:88)")
    text = report.report
    assert "ranks 0-2 (host1,host2) wait in all_reduce #2 on world, 4 B" in text
    assert "rank 3 (host2): not in a collective; last all_reduce #1 on world; step 0" in text
    assert 'File "/job/train.py", line 88 in wait_for_lock' in text
    assert "threading.py" not in text  # only the thread running the script
    assert "runpy" not in text and "bootstrap" not in text  # only the frames of the script
    assert len(text.splitlines()) < 25  # one screen
    assert w.poll(12.0) is None  # reported once


def test_report_goes_out_without_stacks_after_the_wait():
    w = Watchdog(3.0, HOSTS, now=0.0)
    feed_stuck_rank3(w, now=10.0, idle=5.0)
    assert w.poll(10.0).kind == "dump"
    assert w.poll(10.0 + watchdog.STACK_WAIT - 0.1) is None
    report = w.poll(10.0 + watchdog.STACK_WAIT + 0.1)
    assert report.kind == "report" and "rank 3: no stack" in report.headline
    assert "(no Python stack came back)" in report.report


def test_progressing_job_never_trips():
    """Slow steps (longer than... nothing: any record change resets idleness) never make a hang."""
    w = Watchdog(2.0, HOSTS, now=0.0)
    for t in range(1, 60):
        # each rank's record changed 0.9 s ago at every heartbeat (steps of about a second)
        w.event(heartbeat(0, {0: 0.9, 1: 0.9}, {0: rec(step=t), 1: rec(step=t)}), float(t))
        w.event(heartbeat(1, {2: 0.9, 3: 0.9}, {2: rec(step=t), 3: rec(step=t)}), float(t))
        assert w.poll(t + 0.99) is None


def test_one_rank_progressing_is_no_hang():
    """Ranks 0-2 wait on rank 3, which computes for long but still changes its record."""
    w = Watchdog(3.0, HOSTS, now=0.0)
    feed_stuck_rank3(w, now=10.0, idle=8.0)
    w.event(heartbeat(1, {2: 8.0, 3: 0.5}, {2: rec(op="all_reduce", group="world", seq=2),
                                            3: rec(step=1)}), 10.0)
    assert w.poll(12.0) is None


def test_startup_counts_as_progress_until_the_timeout():
    """No heartbeat, or ranks that wrote no record yet: progressing until hang_timeout after the
    start; then a hang that says they never reached the comm layer."""
    w = Watchdog(5.0, {0: "h", 1: "h"}, now=100.0)
    assert w.poll(104.9) is None
    w.event(heartbeat(0, {0: 4.0, 1: 4.0}, {}), 104.0)  # the agent's view: started 4 s ago
    assert w.poll(104.9) is None
    assert w.poll(105.1).kind == "dump"


def test_exited_ranks_are_not_waited_for():
    w = Watchdog(3.0, {0: "h", 1: "h"}, now=0.0)
    w.event(heartbeat(0, {0: 0.0, 1: 0.0}, {0: rec(step=5), 1: rec(step=5)}), 1.0)
    w.event({"event": "exit", "rank": 0, "returncode": 0}, 1.5)
    # rank 1 waits in a collective rank 0 will never join (a hang at the ordinary timeout)
    w.event(heartbeat(0, {1: 0.0}, {1: rec(step=6, op="barrier", group="world", seq=7)}), 2.0)
    assert w.poll(4.9) is None
    assert w.poll(5.1).ranks == [1]
    w.event({"event": "exit", "rank": 1, "returncode": 0}, 5.2)
    assert not w.hung(100.0)  # nothing runs: nothing hangs


def test_a_verdict_is_withdrawn_when_every_rank_ends_while_the_stacks_come():
    """A loaded host's slow teardown: the last ranks sit outside any collective for the timeout,
    then exit while their stacks are collected (the CI trace): no hang, no report."""
    w = Watchdog(3.0, {0: "h", 1: "h", 2: "h"}, now=0.0)
    done = rec(step=0, last=("all_gather_obj", "world", 8))
    w.event(heartbeat(0, {0: 0.0, 1: 0.0, 2: 0.0}, {0: done, 1: done, 2: done}), 1.0)
    w.event({"event": "exit", "rank": 1, "returncode": 0}, 1.2)
    # (some rank finished and none waits in a collective: the stretched timeout applies)
    t = 1.0 + watchdog.ENDING_MIN + 0.1
    assert w.poll(t).kind == "dump"
    w.event({"event": "exit", "rank": 0, "returncode": 0}, t + 0.4)
    w.event({"event": "exit", "rank": 2, "returncode": 0}, t + 0.5)
    assert w.poll(t + 0.6).kind == "withdraw"
    assert w.poll(100.0) is None  # nothing runs: nothing hangs, nothing reported


def test_a_verdict_is_withdrawn_when_a_record_moves_then_a_real_hang_is_reported():
    w = Watchdog(3.0, HOSTS, now=0.0)
    feed_stuck_rank3(w, now=10.0, idle=5.0)
    assert w.poll(10.0).kind == "dump"
    w.event({"event": "stacks", "node_rank": 1, "stacks": {"3": {"python": STACK_LOCK}}}, 10.1)
    # rank 3 entered the collective after all: every record moved on, idleness restarts
    waiting = rec(step=0, op="all_reduce", group="world", seq=2, since=1000.0,
                  last=("all_reduce", "world", 1))
    w.event(heartbeat(1, {2: 0.0, 3: 0.0}, {2: waiting, 3: waiting}), 10.2)
    assert w.poll(10.3).kind == "withdraw"
    assert w.poll(12.0) is None
    # now every rank waits in #2 for the timeout: the collective itself is stuck, reported with a
    # fresh stack (the withdrawn verdict's stack is not reused)
    dump = w.poll(13.3)
    assert dump.kind == "dump"
    report = w.poll(13.3 + watchdog.STACK_WAIT + 0.1)
    assert report.kind == "report"
    assert "the collective itself makes no progress" in report.headline
    assert "wait_for_lock" not in report.report


def test_a_slow_teardown_after_some_ranks_finished_is_given_longer():
    """Ranks 0 and 1 finished; rank 2 sits outside any collective (its teardown on a loaded
    host): no verdict at the ordinary timeout, only after the stretched one. Ranks left in a
    collective by a rank that finished early are a hang at the ordinary timeout."""
    w = Watchdog(3.0, {0: "h", 1: "h", 2: "h"}, now=0.0)
    done = rec(step=0, last=("all_gather_obj", "world", 8))
    w.event(heartbeat(0, {0: 0.0, 1: 0.0, 2: 0.0}, {0: done, 1: done, 2: done}), 1.0)
    w.event({"event": "exit", "rank": 0, "returncode": 0}, 1.1)
    w.event({"event": "exit", "rank": 1, "returncode": 0}, 1.2)
    assert w.poll(10.0) is None
    assert w.poll(1.0 + watchdog.ENDING_MIN - 0.1) is None
    assert w.poll(1.0 + watchdog.ENDING_MIN + 0.1).kind == "dump"

    w = Watchdog(3.0, {0: "h", 1: "h", 2: "h"}, now=0.0)
    waiting = rec(step=0, op="all_reduce", group="world", seq=9, last=("all_gather_obj", "world", 8))
    w.event(heartbeat(0, {1: 0.0, 2: 0.0}, {1: waiting, 2: waiting}), 1.0)
    w.event({"event": "exit", "rank": 0, "returncode": 0}, 1.1)
    assert w.poll(4.1).kind == "dump"


def test_desync_is_reported_at_once_naming_the_odd_rank():
    w = Watchdog(300.0, HOSTS, now=0.0)
    rs = rec(op="reduce_scatter", group="world", seq=5, nbytes=4096, since=999.0,
             last=("all_reduce", "world", 4))
    ag = rec(op="all_gather", group="world", seq=5, nbytes=1024, since=999.0,
             last=("all_reduce", "world", 4))
    w.event(heartbeat(0, {0: 0.2, 1: 0.2}, {0: rs, 1: ag}), 1.0)
    assert w.poll(1.0) is None  # the other node gets a heartbeat to show its side
    w.event(heartbeat(1, {2: 0.2, 3: 0.2}, {2: rs, 3: rs}), 1.5)
    dump = w.poll(1.0 + watchdog.DESYNC_SETTLE)  # idle 0.2 s, far from the 300 s timeout
    assert dump.verdict == "desync" and dump.ranks == [1]
    w.event({"event": "stacks", "stacks": {"1": {"python": STACK_COLLECTIVE}}}, 2.6)
    report = w.poll(2.6)
    assert report.headline.startswith("collective #5 on world differs across ranks: ranks 0,2,3 "
                                      "called reduce_scatter, rank 1 called all_gather")
    assert "rank 1 is in step (train.py:40)" in report.headline  # the user's frame, not torch's
    assert "desynchronised" in report.report


def test_desync_seen_in_completed_collectives_and_p2p_ignored():
    w = Watchdog(300.0, {0: "h", 1: "h"}, now=0.0)
    # point-to-point: rank 0 sends while rank 1 receives under the same (per-process) number
    w.event(heartbeat(0, {0: 0, 1: 0}, {0: rec(op="send", group="p2p", seq=1),
                                        1: rec(op="recv", group="p2p", seq=1)}), 1.0)
    assert w.poll(1.0) is None
    # the same sequence number of a sub-group completed as two different collectives
    w.event(heartbeat(0, {0: 0, 1: 0}, {0: rec(last=("broadcast", "ranks 0-1", 7)),
                                        1: rec(op="all_reduce", group="ranks 0-1", seq=7)}), 2.0)
    assert w.poll(2.0) is None
    dump = w.poll(2.0 + watchdog.DESYNC_SETTLE)
    assert dump.verdict == "desync" and dump.ranks == [0, 1]  # a tie: both sides' stacks


def test_every_member_waiting_means_the_collective_is_stuck():
    w = Watchdog(3.0, {0: "h", 1: "h"}, now=0.0)
    r = rec(op="all_reduce", group="world", seq=9, nbytes=1 << 20, since=990.0)
    w.event(heartbeat(0, {0: 10.0, 1: 10.0}, {0: r, 1: r}), 1.0)
    assert w.poll(1.0).ranks == [0, 1]
    report = w.poll(1.0 + watchdog.STACK_WAIT + 0.1)
    assert report.headline.startswith("every rank of world waits in all_reduce #9")
    assert "1.0 MiB" in report.report


def test_no_collective_at_all():
    w = Watchdog(1.0, {0: "h", 1: "h"}, now=0.0)
    w.event(heartbeat(0, {0: 5.0, 1: 5.0}, {0: rec(step=3), 1: rec(step=3)}), 1.0)
    assert w.poll(1.0).ranks == [0, 1]
    w.event({"event": "stacks", "stacks": {"0": {"python": STACK_LOCK},
                                           "1": {"python": STACK_LOCK}}}, 1.1)
    assert w.poll(1.1).headline.startswith("no rank is in a collective")


def test_a_rank_waiting_in_another_collective_is_named():
    w = Watchdog(1.0, {0: "h", 1: "h", 2: "h"}, now=0.0)
    w.event(heartbeat(0, {0: 5.0, 1: 5.0, 2: 5.0}, {
        0: rec(op="all_reduce", group="world", seq=3),
        1: rec(op="all_reduce", group="world", seq=3),
        2: rec(op="broadcast", group="ranks 1-2", seq=1)}), 1.0)
    assert w.poll(1.0).ranks == [2]
    report = w.poll(5.0)
    assert report.headline == ("rank 2 never entered all_reduce #3 on world that ranks 0,1 wait "
                               "in; rank 2 waits in broadcast #1 on ranks 1-2 instead")


def test_group_members_and_stack_helpers():
    assert group_members("world", [3, 1, 2]) == [1, 2, 3]
    assert group_members("ranks 0-2,5,8-9", []) == [0, 1, 2, 5, 8, 9]
    assert group_members("ranks 0..99 n100 deadbeef", []) is None
    frames = main_thread_frames(STACK_LOCK)
    assert frames[0] == ("/job/train.py", 88, "wait_for_lock")
    assert where(frames) == "wait_for_lock (train.py:88)"
    assert where(main_thread_frames(STACK_COLLECTIVE)) == "step (train.py:40)"
    assert where([]) == "" and main_thread_frames("garbage") == []


def test_an_agent_that_sends_no_idleness_is_never_judged():
    """An older agent on one host (heartbeats without "idle"): its ranks count as progressing."""
    w = Watchdog(1.0, HOSTS, now=0.0)
    for t in range(1, 10):
        w.event(heartbeat(0, {0: 9.0, 1: 9.0}, {}), float(t))
        w.event({"event": "heartbeat", "node_rank": 1, "host": "host2", "time": 0.0,
                 "progress": {}}, float(t))
        assert w.poll(t + 0.5) is None


def test_pipeline_waits_split_over_groups_name_the_rank_outside_any_call():
    """A pipeline job's waits split over groups (data groups 'ranks 0,2' and 'ranks 1,3'): rank 0
    waits in its data group's all-reduce for rank 2, which itself waits in a p2p receive; rank 1
    waits in its own for rank 3, which is stuck outside any call. Each group has one waiter; the
    one a member keeps waiting from outside any call is the wait that matters, so rank 3 is named,
    not rank 2 (which only waits on the pipeline; it was named before)."""
    w = Watchdog(3.0, HOSTS, now=0.0)
    idle = 5.0
    w.event(heartbeat(0, {0: idle, 1: idle}, {
        0: rec(step=2, op="all_reduce", group="ranks 0,2", seq=7, since=1000.0 - idle),
        1: rec(step=2, op="all_reduce", group="ranks 1,3", seq=7, since=1000.0 - idle)}), 10.0)
    w.event(heartbeat(1, {2: idle, 3: idle + 0.5}, {
        2: rec(step=2, op="recv", group="p2p", seq=11, since=1000.0 - idle),
        3: rec(step=2, last=("recv", "p2p", 9))}), 10.0)
    dump = w.poll(10.0)
    assert dump.kind == "dump" and dump.verdict == "hang" and dump.ranks == [3]
    report = w.poll(10.0 + watchdog.STACK_WAIT + 0.1)
    assert report.headline.startswith("rank 3 never entered all_reduce #7 on ranks 1,3 that "
                                      "rank 1 wait in"), report.headline
