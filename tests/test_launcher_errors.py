"""The root-cause rule (dslaunch/launcher/errors.py) as pure logic: no processes started."""

from __future__ import annotations

import json

from dslaunch.launcher import errors
from dslaunch.launcher.errors import Failure


def _exit(rank, returncode=1, time=100.0, stopped=False, **extra) -> dict:
    return {"event": "exit", "rank": rank, "host": "h", "returncode": returncode,
            "time": time, "stopped": stopped, **extra}


def _failures(*exit_events) -> list:
    """What the controller records: a failure for each exit that counts, in arrival order."""
    return [errors.rank_failure(e) for e in exit_events if errors.counts_as_failure(e)]


def test_earliest_failure_wins_not_first_to_arrive():
    peer = _exit(0, returncode=5, time=20.0)  # lost its connection to rank 1: arrives first
    real = _exit(1, time=10.0, error={"exc_type": "RuntimeError", "message": "the real one"})
    root = errors.root_cause(_failures(peer, real))
    assert root.text == "rank 1 (host h) exited with code 1: RuntimeError: the real one"


def test_ranks_stopped_by_us_are_never_failures():
    assert not errors.counts_as_failure(_exit(0, returncode=-15, stopped=True))
    assert not errors.counts_as_failure(_exit(0, returncode=0))
    assert errors.counts_as_failure(_exit(0, returncode=-9))
    # A stopped rank exits "earlier" than the real failure's report but must not become the root.
    root = errors.root_cause(_failures(_exit(0, returncode=-15, time=1.0, stopped=True),
                                       _exit(1, time=5.0)))
    assert root.text == "rank 1 (host h) exited with code 1"


def test_caused_by_stop_is_at_or_after_the_stop():
    assert not errors.caused_by_stop(10.0, None)  # no stop yet: the rank failed by itself
    assert not errors.caused_by_stop(9.9, 10.0)  # recorded before the stop, exited after: a cause
    assert errors.caused_by_stop(10.0, 10.0)
    assert errors.caused_by_stop(10.1, 10.0)


def test_failure_time_is_the_exception_not_the_exit():
    assert errors.failure_time({"time": 3.0, "exc_type": "E"}, 7.0) == 3.0
    assert errors.failure_time(None, 7.0) == 7.0
    assert errors.failure_time({"exc_type": "E"}, 7.0) == 7.0


def test_tie_goes_to_the_first_recorded():
    first, second = Failure(5.0, "rank", "first"), Failure(5.0, "rank", "second")
    assert errors.root_cause([first, second]) is first
    assert errors.root_cause([second, first]) is second


def test_no_failure_no_root():
    assert errors.root_cause([]) is None


def test_summary_names_root_then_consequences_earliest_first():
    root = Failure(1.0, "rank", "rank 1 (host h) exited with code 1", ["Traceback", "E: x"],
                   "traceback (last lines):")
    later = [Failure(9.0 - i, "rank", f"late {i}") for i in range(7)]
    text = errors.summary(root, [*later, root], stopped=2)
    assert text.splitlines() == [
        "job failed: rank 1 (host h) exited with code 1",
        "  traceback (last lines):",
        "    Traceback",
        "    E: x",
        "  later failures (consequences): 7",
        "    late 6", "    late 5", "    late 4", "    late 3", "    late 2",
        "  stopped 2 other rank(s)",
    ]


def test_rank_failure_without_error_shows_output_or_says_nothing_printed():
    f = errors.rank_failure(_exit(0, returncode=-9, signal="SIGKILL", output_tail=["bye"]))
    assert (f.text, f.detail, f.detail_title) == (
        "rank 0 (host h) was killed by SIGKILL", ["bye"], "last output lines:")
    f = errors.rank_failure(_exit(0, returncode=3))
    assert errors.summary(f, [f], 0) == ("job failed: rank 0 (host h) exited with code 3\n"
                                         "  (it printed nothing)")


def test_read_rank_error_keeps_the_traceback_tail(tmp_path):
    path = tmp_path / "error_0.json"
    assert errors.read_rank_error(str(path), 2) is None  # the rank recorded nothing
    path.write_text(json.dumps({"time": 4.0, "exc_type": "E", "traceback": "a\nb\nc\n"}))
    assert errors.read_rank_error(str(path), 2) == {"time": 4.0, "exc_type": "E",
                                                    "traceback_tail": ["b", "c"]}


def test_a_peer_that_lost_its_connection_does_not_hide_a_killed_rank():
    # rank 1 is SIGKILLed; rank 0's next collective fails on the dead connection a few ms before
    # rank 1's agent reaps it and stamps its exit: the kill is the cause, not the peer's error.
    peer = _exit(0, time=100.000, error={"exc_type": "RuntimeError", "message":
                 "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234"})
    killed = _exit(1, returncode=-9, time=100.030, signal="SIGKILL")
    root = errors.root_cause(_failures(peer, killed))
    assert root.text == "rank 1 (host h) was killed by SIGKILL"
    # ...but only within the window: a kill long after is a consequence, not the cause
    late = _exit(1, returncode=-9, time=100.0 + errors.PEER_WINDOW + 1, signal="SIGKILL")
    assert errors.root_cause(_failures(peer, late)).text.startswith("rank 0 ")
    # and an ordinary error stays the cause of a later kill
    boom = _exit(0, time=100.0, error={"exc_type": "ValueError", "message": "boom"})
    assert errors.root_cause(_failures(boom, killed)).text.startswith("rank 0 ")
