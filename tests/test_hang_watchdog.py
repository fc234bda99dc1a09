"""`dslaunch run --hang-timeout`: real jobs on this host (local launcher) with a rank stuck outside
a collective, desynchronised collectives, and a slow but healthy job (no alarm). The watchdog's
logic itself: test_watchdog.py."""

from __future__ import annotations

import json

from test_launch import assert_no_leftovers, marker_env

from helpers import SCRIPTS, dslaunch


def test_rank_stuck_outside_a_collective_is_reported_and_the_job_stops():
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 4, "--hang-timeout", 3, "--grace-period", 2,
                 SCRIPTS / "hang_rank.py", "stuck", 3, env=env)
    assert r.returncode != 0
    err = r.stderr
    report = err[err.index("hang watchdog: no rank has made progress"):]
    assert "ranks 0-2 (localhost) wait in all_reduce #2 on world, 16 B" in report
    assert "rank 3 (localhost): not in a collective; last all_reduce #1 on world" in report
    assert "line 24 in wait_for_lock" in report  # its stack
    assert ("diagnosis: rank 3 never entered all_reduce #2 on world that ranks 0-2 wait in; "
            "rank 3 is in wait_for_lock (hang_rank.py:24)") in report
    # the verdict is the root cause, the ranks it stopped are not failures
    assert "job failed: hang: rank 3 never entered all_reduce #2" in err
    assert "stopped 4 other rank(s)" in err
    # the failure stop still dumps every rank's stacks into its own output
    assert any(line.startswith("[rank 3]") and "in wait_for_lock" in line
               for line in r.stdout.splitlines()), r.stdout[-2000:]
    assert_no_leftovers(marker)


def test_desynchronised_collectives_are_reported_before_any_timeout():
    marker, env = marker_env()
    # the default timeout (300 s): only the desync rule can end this job in the test's time
    r = dslaunch("run", "--nproc-per-node", 3, "--grace-period", 2, SCRIPTS / "hang_rank.py",
                 "desync", 1, env=env, timeout=90)
    assert r.returncode != 0
    assert "hang watchdog: collectives desynchronised" in r.stderr
    assert ("job failed: collectives desynchronised: collective #2 on world differs across "
            "ranks: ranks 0,2 called reduce_scatter, rank 1 called all_gather") in r.stderr
    assert "rank 1 (localhost) waits in all_gather #2 on world" in r.stderr
    assert_no_leftovers(marker)


def test_slow_progressing_job_raises_no_alarm():
    r = dslaunch("run", "--nproc-per-node", 3, "--hang-timeout", 2, SCRIPTS / "hang_rank.py",
                 "slow", 0, 5)
    assert r.returncode == 0, r.stderr
    assert "hang watchdog" not in r.stderr
    assert r.stdout.count(" done") == 3


def test_flag_wins_over_the_config_key():
    from dslaunch.cli.run import HANG_TIMEOUT, _hang_timeout

    written = json.dumps({"fault_tolerance": {"hang_timeout": 60}})
    assert _hang_timeout(None, written) == 60.0
    assert _hang_timeout(0.0, written) == 0.0  # --hang-timeout 0 disables whatever the config says
    assert _hang_timeout(None, json.dumps({"fault_tolerance": None})) == HANG_TIMEOUT
    assert _hang_timeout(None, None) == HANG_TIMEOUT == 300.0


def test_config_key_sets_the_timeout(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                               "fault_tolerance": {"hang_timeout": 2}}))
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--config", cfg, "--grace-period", 1,
                 SCRIPTS / "hang_rank.py", "stuck", 1, env=env)
    assert "hang timeout 2 s" in r.stderr and r.returncode != 0
    assert_no_leftovers(marker)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fault_tolerance": {"hang_timeout": "soon"}}))
    r = dslaunch("run", "--nproc-per-node", 2, "--config", bad, SCRIPTS / "hang_rank.py",
                 "slow", 0, 1)
    assert r.returncode != 0 and "fault_tolerance.hang_timeout" in r.stderr
    r = dslaunch("run", "--nproc-per-node", 2, "--hang-timeout", "-1", SCRIPTS / "hang_rank.py",
                 "slow", 0, 1)
    assert r.returncode != 0 and "--hang-timeout" in r.stderr
