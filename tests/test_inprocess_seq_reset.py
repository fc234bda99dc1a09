"""In-process recovery makes the process group anew (``engine/recovery/rejoin.join_group``, on
survivors and replacements alike): the progress record's per-group collective sequence numbers
start again at 1 there. Kept, a survivor's numbers ran ahead of a replacement's by all the
collectives made before the fault, and the hang watchdog, which compares the collectives ranks
entered under one number, reported a desync that was none and restarted the job
(benchmarks/bench_resilience.py part e, ZeRO 2, a fault every 40 s: "collective #831 on world
differs across ranks: rank 1 called all_gather, rank 0 called all_reduce", 35 s after rank 0 was
replaced)."""

from __future__ import annotations

import socket


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_new_groups_numbers_collectives_from_one(tmp_path):
    from dslaunch.progress_record import ProgressWriter, read

    w = ProgressWriter(str(tmp_path / "progress.bin"))
    for _ in range(3):
        w.enter("all_reduce", "world")
        w.leave()
    assert w.enter("all_gather", "world") == 4
    w.leave()
    w.new_groups()
    rec = read(str(tmp_path / "progress.bin"))
    assert (rec["coll_seq"], rec["last_seq"], rec["coll_op"], rec["last_op"]) == (0, 0, "", "")
    assert w.enter("all_gather_obj", "world") == 1  # as on a replacement that joined just now


def test_joining_the_new_group_restarts_the_numbers(tmp_path, monkeypatch):
    """The recovery's own join (a one-rank world here) resets this process's record."""
    import torch.distributed as dist

    from dslaunch import progress_record
    from dslaunch.engine.recovery import rejoin

    monkeypatch.setenv(progress_record.ENV, str(tmp_path / "progress.bin"))
    # join_group sets these four in os.environ: setenv first, so that monkeypatch puts the
    # environment back as it found it (a bare delenv of an absent key records nothing, and
    # the test's MASTER_ADDR/PORT leaked into later tests' subprocesses: EADDRINUSE there)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    w = progress_record.writer()
    for _ in range(5):
        w.enter("reduce_scatter", "world")
        w.leave()
    word = {"master_addr": "127.0.0.1", "master_port": _free_port(), "rank": 0, "world_size": 1}
    try:
        rejoin.join_group(word)
        assert dist.get_world_size() == 1
        assert w.enter("all_gather_obj", "world") == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
