"""What the four-rank in-process recovery tests (test_inprocess_autotp.py, test_inprocess_pipe.py)
read from a job's output and check of it: the faulty run recovered in process with the survivors'
processes kept, and it trained exactly as the fault-free run did."""

from __future__ import annotations

import json
import re


def losses(out: str) -> dict:
    """step -> rank 0's loss."""
    return {int(s): float(v) for s, v in re.findall(r"\[rank 0\] step (\d+) loss ([\d.e+-]+)", out)}


def starts(out: str) -> dict:
    """rank -> the pids that printed a start line, in order."""
    found: dict = {}
    for rank, pid in re.findall(r"\[rank \d+\] rank (\d+) pid (\d+) start", out):
        found.setdefault(int(rank), []).append(int(pid))
    return found


def rank_digests(out: str) -> dict:
    return {int(r): d for r, d in re.findall(r"rank (\d+) pid \d+ done (\w+)", out)}


def incidents(logs) -> list:
    path = logs / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_replaced_in_process(r, lost: int, step: int) -> None:
    """The faulty job finished after one in-process recovery: the 3 survivors kept their
    processes, and ``lost`` started once more, joining at ``step``."""
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"recovering in process: the other 3 ranks keep running, rank {lost} starts again"
            in r.stderr), r.stderr[-3000:]
    assert "recovered in process" in r.stderr and "restarting" not in r.stderr, \
        r.stderr[-3000:] + r.stdout[-3000:]  # (the ranks' side of a recovery that failed)
    pids = starts(r.stdout)
    assert all(len(pids[k]) == 1 for k in range(4) if k != lost)  # the survivors: one each
    assert len(pids[lost]) == 2 and pids[lost][0] != pids[lost][1]
    assert re.search(rf"rank {lost} pid \d+ start at step {step}", r.stdout)  # joined at the step


def assert_trained_as_fault_free(r, ref, logs, lost: int, steps: int, distinct: int) -> None:
    """Every step's loss and every rank's final state digest equal the fault-free run's (``ref``)
    bit for bit, no step redone; ``distinct`` digests (ranks that hold different state: a check
    that can fail)."""
    assert ref.returncode == 0, ref.stderr[-3000:]
    got = losses(r.stdout)
    assert sorted(got) == list(range(1, steps + 1))  # no step redone, none missing
    assert got == losses(ref.stdout)
    digests = rank_digests(ref.stdout)
    assert rank_digests(r.stdout) == digests
    assert len(set(digests.values())) == distinct
    [inc] = incidents(logs)
    assert inc["action"] == "in-process" and inc["culprit_rank"] == lost
    assert inc["steps_redone"] == 0 and inc["world_size_after"] == 4
    print(f"seconds to training again: {inc['seconds_to_training']}")
