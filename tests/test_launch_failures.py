"""`dslaunch run` when things go wrong: fail-fast with the root cause's traceback, a rank killed by
a signal, Ctrl-C, a lost agent, stack dumps of hung ranks — and never a process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
from test_launch import assert_no_leftovers, marker_env

from helpers import DSLAUNCH, SCRIPTS, dslaunch


def test_fail_fast_names_rank_and_shows_traceback(tmp_path):
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--grace-period", 2, SCRIPTS / "launch_fail.py",
                 tmp_path, "raise", 1, env=env)
    assert r.returncode != 0
    summary = r.stderr
    assert "job failed: rank 1 (host localhost) exited with code 1" in summary
    assert "ValueError: deliberate failure in rank 1" in summary
    assert "launch_fail.py" in summary and "in fail_now" in summary  # traceback tail
    assert "runpy" not in summary and "bootstrap" not in summary  # only the user's frames
    assert "stopped 1 other rank(s)" in summary
    assert "[rank 1] ValueError: deliberate failure in rank 1" in r.stdout  # its own output too
    assert_no_leftovers(marker)


def test_hung_rank_dumps_its_stack_when_another_fails(tmp_path):
    r = dslaunch("run", "--nproc-per-node", 2, "--grace-period", 2, SCRIPTS / "launch_fail.py",
                 tmp_path, "exit3", 1)
    assert r.returncode != 0
    assert "rank 1 (host localhost) exited with code 3" in r.stderr
    dump = [line for line in r.stdout.splitlines() if line.startswith("[rank 0] ")]
    assert any("most recent call first" in line for line in dump), r.stdout
    assert any("in wait_forever" in line for line in dump), r.stdout


def test_rank_killed_by_signal_is_reported_by_name(tmp_path):
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--grace-period", 2, SCRIPTS / "launch_fail.py",
                 tmp_path, "sigkill", 0, env=env)
    assert r.returncode != 0
    assert "rank 0 (host localhost) was killed by SIGKILL" in r.stderr
    assert "last output lines:" in r.stderr and "rank 0 failing: sigkill" in r.stderr
    assert_no_leftovers(marker)


def _start_and_wait_ready(args, env, n=2) -> subprocess.Popen:
    proc = subprocess.Popen([*DSLAUNCH, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    ready = 0
    while ready < n:
        line = proc.stdout.readline()
        assert line, f"launcher ended early: {proc.stderr.read()}"
        ready += line.endswith("] ready\n")
    return proc


def test_ctrl_c_stops_every_rank(tmp_path):
    marker, env = marker_env()
    proc = _start_and_wait_ready(["run", "--nproc-per-node", 2, SCRIPTS / "launch_sleep.py"], env)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted (SIGINT)" in err
    assert_no_leftovers(marker)


def test_second_ctrl_c_kills_ranks_that_ignore_sigterm(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('ready', flush=True)\nwhile True: time.sleep(0.2)\n")
    marker, env = marker_env()
    proc = _start_and_wait_ready(["run", "--nproc-per-node", 2, "--grace-period", 120, script], env)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # the first Ctrl-C's SIGTERM is ignored; the grace period is long
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert_no_leftovers(marker)


def test_sigterm_to_launcher_stops_every_rank(tmp_path):
    marker, env = marker_env()
    proc = _start_and_wait_ready(["run", "--nproc-per-node", 2, SCRIPTS / "launch_sleep.py"], env)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert_no_leftovers(marker)


def test_silent_agent_is_declared_lost(tmp_path):
    """An agent that stops sending heartbeats (SIGSTOP: like a frozen host) ends the job, naming
    the host, and its ranks are still cleaned up."""
    marker, env = marker_env()
    proc = _start_and_wait_ready(["run", "--nproc-per-node", 2, "--heartbeat-timeout", 2,
                                  SCRIPTS / "launch_sleep.py"], env)
    agents = [c for c in psutil.Process(proc.pid).children()
              if "dslaunch.launcher.agent" in " ".join(c.cmdline())]
    assert len(agents) == 1
    os.kill(agents[0].pid, signal.SIGSTOP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "host localhost (node 0) lost: no heartbeat" in err
    assert_no_leftovers(marker)


def test_slow_starting_agent_is_not_lost(tmp_path):
    """The heartbeat timeout counts from an agent's first word: a fan-out that takes longer than
    it to start the agent (mpirun waiting for munge, a slow srun) is not a lost host."""
    (tmp_path / "sitecustomize.py").write_text(
        "import time\n"
        "if b'dslaunch.launcher.agent' in open('/proc/self/cmdline', 'rb').read():\n"
        "    time.sleep(4)\n")
    (tmp_path / "hello.py").write_text("print('HELLO')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = dslaunch("run", "--nproc-per-node", 1, "--heartbeat-timeout", 1, tmp_path / "hello.py",
                 env=env)
    assert r.returncode == 0, r.stderr
    assert "[rank 0] HELLO" in r.stdout


def test_launcher_killed_outright_leaves_nothing(tmp_path):
    """SIGKILL to the launcher: its agent sees EOF on stdin and stops the ranks by itself."""
    marker, env = marker_env()
    proc = _start_and_wait_ready(["run", "--nproc-per-node", 2, "--grace-period", 2,
                                  SCRIPTS / "launch_sleep.py"], env)
    proc.kill()
    proc.wait(timeout=30)
    assert_no_leftovers(marker, wait=15)


def test_root_cause_is_earliest_failure_not_first_reported(tmp_path):
    r = dslaunch("run", "--nproc-per-node", 2, "--grace-period", 1, SCRIPTS / "launch_order.py", tmp_path)
    assert r.returncode != 0
    assert "job failed: rank 1 (host localhost)" in r.stderr, r.stderr
    assert "RuntimeError: the real root cause" in r.stderr
    assert "rank 0 (host localhost) exited with code 5" in r.stderr  # listed as a consequence


def test_missing_module_is_reported_as_the_ranks_failure(tmp_path):
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "-m", "no_such_module_xyz", cwd=tmp_path, env=env)
    assert r.returncode != 0
    assert "job failed: rank" in r.stderr
    assert "No module named no_such_module_xyz" in r.stderr
    assert_no_leftovers(marker)
