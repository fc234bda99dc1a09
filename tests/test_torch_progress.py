"""The hang watchdog on plain torch.distributed scripts (no dslaunch import): the bootstrap records
their collectives (dslaunch/torch_progress.py), the agent tells a computing rank from a stuck one
(dslaunch/launcher/idleness.py). Real `dslaunch run` jobs on this host, real gloo groups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from test_launch import assert_no_leftovers, marker_env

from dslaunch.launcher.idleness import BUSY_SHARE, CLK_TCK, Idleness, cpu_ticks
from helpers import DSLAUNCH, ROOT, SCRIPTS, dslaunch

PLAIN = SCRIPTS / "plain_torch_rank.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed_run(args: list, env: dict, timeout: float) -> tuple:
    """Run ``dslaunch ARGS``; (returncode, [(monotonic time, stream, line)])."""
    proc = subprocess.Popen([*DSLAUNCH, *map(str, args)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list = []

    def pump(stream, name):
        for line in stream:
            lines.append((time.monotonic(), name, line.rstrip("\n")))

    pumps = [threading.Thread(target=pump, args=(proc.stdout, "out")),
             threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for p in pumps:
        p.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    for p in pumps:
        p.join()
    return rc, lines


def test_plain_torch_rank_stuck_in_its_own_function_is_named_within_the_timeout():
    timeout = 10
    marker, env = marker_env()
    rc, lines = _timed_run(["run", "--nproc-per-node", 4, "--hang-timeout", timeout,
                            "--grace-period", 2, PLAIN, "stuck", 3], env, timeout=150)
    err = "\n".join(text for _, name, text in lines if name == "err")
    assert rc != 0, err[-3000:]
    ready = [t for t, name, text in lines if name == "out" and " ready pid " in text]
    assert len(ready) == 4, err[-3000:]  # every rank did all_reduce #1
    report_at = next(t for t, name, text in lines
                     if name == "err" and "hang watchdog: no rank has made progress" in text)
    assert report_at - max(ready) <= timeout + 10
    report = err[err.index("hang watchdog: no rank has made progress"):]
    assert "ranks 0-2 (localhost) wait in all_reduce #2 on world, 16 B" in report
    assert "rank 3 (localhost): not in a collective; last all_reduce #1 on world" in report
    assert ("job failed: hang: rank 3 never entered all_reduce #2 on world that ranks 0-2 wait "
            "in; rank 3 is in wait_for_data (plain_torch_rank.py:") in err
    assert_no_leftovers(marker)


def test_plain_torch_rank_stuck_before_an_async_wait():
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 3, "--hang-timeout", 4, "--grace-period", 2,
                 PLAIN, "async", 2, env=env, timeout=120)
    assert r.returncode != 0
    # ranks 0,1 sit in work.wait() of an async all_reduce: shown in it, numbered as issued
    assert "ranks 0,1 (localhost) wait in all_reduce #2 on world" in r.stderr, r.stderr[-3000:]
    assert "rank 2 is in wait_for_data (plain_torch_rank.py:" in r.stderr
    assert_no_leftovers(marker)


def test_plain_torch_desync_is_reported_before_any_timeout():
    marker, env = marker_env()
    # the default timeout (300 s): only the desync rule can end this job in the test's time
    r = dslaunch("run", "--nproc-per-node", 3, "--grace-period", 2, PLAIN, "desync", 1,
                 env=env, timeout=90)
    assert r.returncode != 0
    assert "hang watchdog: collectives desynchronised" in r.stderr, r.stderr[-3000:]
    assert ("collective #2 on world differs across ranks: ranks 0,2 called reduce_scatter, "
            "rank 1 called all_gather") in r.stderr
    assert_no_leftovers(marker)


def test_plain_torch_long_compute_between_collectives_is_no_hang():
    # rank 1 computes for three hang timeouts while the others wait in a barrier: no alarm
    r = dslaunch("run", "--nproc-per-node", 3, "--hang-timeout", 4, PLAIN, "compute", 1, 12,
                 timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "hang watchdog" not in r.stderr
    assert r.stdout.count(" done") == 3


def test_collectives_are_recorded_once_from_the_bootstrap(tmp_path):
    progress = tmp_path / "progress.bin"
    env = dict(os.environ, DSLAUNCH_PROGRESS_FILE=str(progress), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "dslaunch.launcher.bootstrap",
                        str(SCRIPTS / "torch_progress_check.py")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["installed_at_import"]  # before the script's first line after its imports
    done = {"coll_op": "", "coll_seq": 0}
    assert out["all_reduce"] == {**done, "last_op": "all_reduce", "last_seq": 1,
                                 "last_group": "world"}
    # all_gather_object's own all_gather is not a second collective
    assert out["all_gather_object"] == {**done, "last_op": "all_gather_obj", "last_seq": 2,
                                        "last_group": "world"}
    assert out["subgroup"] == {**done, "last_op": "broadcast", "last_seq": 1,
                               "last_group": "ranks 0"}
    assert out["async_issued"]["last_seq"] == 3 and out["async_pending"] == 1
    assert out["async_waited_pending"] == 0
    # the engine's Comm records its call itself: #4, once
    assert out["engine"]["last_seq"] == 4 and out["engine"]["last_op"] == "all_reduce"
    assert out["group_method"]["last_seq"] == 5  # ProcessGroup.allreduce called directly
    assert out["other_thread"]["last_seq"] == 5  # only the main thread's calls
    assert out["uninstalled"] and out["after_uninstall"]["last_seq"] == 5


def test_no_recording_without_a_progress_file_or_when_turned_off(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import torch.distributed as dist\n"
                      "print(hasattr(dist.all_reduce, '__dslaunch_original__'))\n")
    env = {k: v for k, v in os.environ.items() if k != "DSLAUNCH_PROGRESS_FILE"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "dslaunch.launcher.bootstrap", str(script)]
    for extra, expect in (({}, "False"),
                          ({"DSLAUNCH_PROGRESS_FILE": str(tmp_path / "p.bin"),
                            "DSLAUNCH_TORCH_PROGRESS": "0"}, "False"),
                          ({"DSLAUNCH_PROGRESS_FILE": str(tmp_path / "p.bin")}, "True")):
        r = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == expect, extra


# ---- the agent's rule, on real processes' CPU time ---------------------------------------------
def _watch(proc, seconds: float, record=None) -> float:
    """Feed an Idleness with ``proc``'s real CPU time once every 0.5 s for ``seconds``; its
    idleness at the end."""
    clock = Idleness(time.monotonic())
    idle = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        idle = clock.update(record, cpu_ticks(proc.pid), time.monotonic(), time.time())
    return idle


def _spinning():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_a_computing_rank_outside_a_collective_progresses_a_sleeping_one_does_not():
    assert CLK_TCK > 0 and 0 < BUSY_SHARE < 1
    busy = _spinning()
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(1.0)  # past the interpreters' start
        outside = {"coll_op": "", "updated": time.time()}
        assert _watch(busy, 4, outside) < 2  # computing: progress at every look
        assert _watch(asleep, 4, outside) >= 3
        assert _watch(busy, 4, None) < 2  # no record yet: the same rule
    finally:
        busy.kill()
        asleep.kill()
        busy.wait()
        asleep.wait()


def test_cpu_inside_a_collective_is_not_progress():
    busy = _spinning()
    try:
        inside = {"coll_op": "all_reduce", "updated": time.time()}  # a spinning waiter
        assert _watch(busy, 4, inside) >= 3
    finally:
        busy.kill()
        busy.wait()


def test_a_changed_record_is_progress():
    clock = Idleness(100.0)
    rec = {"coll_op": "", "updated": 1000.0, "step": 1}
    assert clock.update(rec, None, 101.0, 1000.5) == 0.5  # stamped half a second ago
    assert clock.update(rec, None, 110.0, 1009.5) == 9.5  # unchanged, no CPU known
    assert clock.update({**rec, "step": 2, "updated": 1009.9}, None, 111.0, 1010.0) == 0.1
