"""`dslaunch run` on this host, end to end: plan, rank env, argument passthrough, -m, logs, config,
and a real gloo all_reduce. Every job here is a real `dslaunch run` subprocess with 2 ranks.
Failure handling (fail-fast, signals, orphans) is in test_launch_failures.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from dslaunch.launcher.plan import free_port
from helpers import SCRIPTS, dslaunch


def marker_env() -> tuple:
    """An env marker every rank inherits, to find leftovers of exactly this job with psutil."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, DSLAUNCH_TEST_MARKER=marker)
    return marker, env


def marked_processes(marker: str) -> list:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("DSLAUNCH_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def assert_no_leftovers(marker: str, wait: float = 5.0) -> None:
    """No process of the job remains (a short wait lets a SIGKILLed process be reaped)."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in marked_processes(marker) if p.pid != os.getpid()]
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"


def _alive(p) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_ranks(out: Path, n: int = 2) -> list:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(n)]


# ---- plan ------------------------------------------------------------------------------------------

def test_dry_run_json_plan_shape_and_values(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=4\n")
    created = tmp_path / "created"
    r = dslaunch("run", "-H", hostfile, "-i", "localhost:1,3", "--master-port", 29611,
                 "--env", "DSLAUNCH_TEST_VALUE=a b", "--dry-run", "--json",
                 SCRIPTS / "launch_env.py", created)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    for key in ("world_size", "master_addr", "master_port", "launcher", "nodes", "env", "commands"):
        assert key in plan
    assert plan["world_size"] == 2
    assert plan["master_addr"] == "127.0.0.1"
    assert plan["master_port"] == 29611
    assert plan["launcher"] == "local"
    assert plan["nodes"] == [{"host": "localhost", "node_rank": 0, "slots": [1, 3], "ranks": [0, 1]}]
    assert plan["env"]["DSLAUNCH_TEST_VALUE"] == "a b"
    assert plan["env_sources"]["DSLAUNCH_TEST_VALUE"] == "--env"
    assert len(plan["commands"]) == 1 and "dslaunch.launcher.agent" in plan["commands"][0]
    assert plan["program"] == [str(SCRIPTS / "launch_env.py"), str(created)]
    assert not created.exists()  # nothing ran


def test_dry_run_readable_summary_and_default_port(tmp_path):
    r = dslaunch("run", "--nproc-per-node", 2, "--dry-run", SCRIPTS / "launch_env.py", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "world size: 2" in r.stdout
    assert "node 0 localhost: slots [0, 1] -> ranks [0, 1]" in r.stdout
    port = int(r.stdout.split("master: 127.0.0.1:")[1].split()[0])
    assert 0 < port < 65536
    assert not list(tmp_path.iterdir())


def test_deepspeed_option_spellings(tmp_path):
    r = dslaunch("run", "--num_gpus", 2, "--master_addr", "10.0.0.7", "--master_port", 29612,
                 "--dry-run", "--json", SCRIPTS / "launch_env.py", tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["world_size"], plan["master_addr"], plan["master_port"]) == (2, "10.0.0.7", 29612)


# ---- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["missing_script.py"], "script not found: missing_script.py"),
    (["--bogus-option", "x.py"], "no such option: --bogus-option"),
    (["--nproc-per-node", "2", "-i", "localhost:0", str(SCRIPTS / "launch_env.py")],
     "cannot be used together"),
    (["--launcher", "nosuch", "x.py"], "unknown launcher 'nosuch'"),
    (["--env", "NOEQUALS", str(SCRIPTS / "launch_env.py")], "--env"),
])
def test_bad_input_is_one_clear_error(args, message):
    r = dslaunch("run", *args)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_lists_problems_and_starts_nothing(tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimisation": {"stage": 0},
                               "gradient_clipping": "high"}))
    out = tmp_path / "out"
    out.mkdir()
    r = dslaunch("run", "--nproc-per-node", 2, "--config", cfg, SCRIPTS / "launch_env.py", out)
    assert r.returncode != 0
    assert "zero_optimisation" in r.stderr and "zero_optimization" in r.stderr  # typo + suggestion
    assert "gradient_clipping" in r.stderr  # all problems at once
    assert "no rank was started" in r.stderr
    assert not list(out.iterdir())


# ---- what each rank gets ---------------------------------------------------------------------------

def test_rank_env_and_config(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}))
    token = uuid.uuid4().hex  # from an env file, as users keep their tokens
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / ".dslaunch_env").write_text(f"DSLAUNCH_TEST_TOKEN={token}\n")
    port = free_port()  # not a fixed one: another test run (an xdist worker) may hold it
    r = dslaunch("run", "--nproc-per-node", 2, "--master-port", port, "--config", cfg,
                 "--env", "DSLAUNCH_TEST_VALUE=x=$HOME `y`", SCRIPTS / "launch_env.py", tmp_path,
                 cwd=workdir)
    assert r.returncode == 0, r.stderr
    ranks = read_ranks(tmp_path)
    for rec in ranks:  # the environment reached the ranks over the agent's stdin, not its argv
        assert rec["env"]["DSLAUNCH_TEST_TOKEN"] == token and rec["token_in_argv"] is False
        assert rec["env"]["DSLAUNCH_PLAN_ENV"] is None
    cores = len(os.sched_getaffinity(0))
    for i, rec in enumerate(ranks):
        env = rec["env"]
        assert env["RANK"] == str(i) and env["LOCAL_RANK"] == str(i)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2" and env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
        assert env["DSLAUNCH_TEST_VALUE"] == "x=$HOME `y`"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["DSLAUNCH_RESTART_COUNT"] == "0"
        if "OMP_NUM_THREADS" not in os.environ:
            assert env["OMP_NUM_THREADS"] == str(max(1, cores // 2))
        # the config as written (validated by the launcher): each rank resolves it itself, with
        # its real data-parallel size, and names the file in its errors
        assert json.loads(env["DSLAUNCH_CONFIG"]) == {"train_micro_batch_size_per_gpu": 2,
                                                      "gradient_accumulation_steps": 1}
        assert env["DSLAUNCH_CONFIG_PATH"] == str(cfg)
        assert rec["name"] == "__main__"
        assert rec["path0"] == str(SCRIPTS)
    assert "[rank 0] wrote rank 0" in r.stdout and "[rank 1] wrote rank 1" in r.stdout


def test_omp_threads_option_and_inherited_value(tmp_path):
    r = dslaunch("run", "--nproc-per-node", 2, "--omp-threads", 3, SCRIPTS / "launch_env.py", tmp_path)
    assert r.returncode == 0, r.stderr
    assert [x["env"]["OMP_NUM_THREADS"] for x in read_ranks(tmp_path)] == ["3", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="7")
    r = dslaunch("run", "--nproc-per-node", 2, SCRIPTS / "launch_env.py", tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert [x["env"]["OMP_NUM_THREADS"] for x in read_ranks(tmp_path)] == ["7", "7"]


HOSTILE = ["it's", "$(touch f)", "`touch f`", "two words", "line1\nline2", "--config", "x",
           "--nproc-per-node", "5", "$HOME", '"dq"', "--", "-m", "", "ünï"]


def test_hostile_arguments_pass_through_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = dslaunch("run", "--nproc-per-node", 2, SCRIPTS / "launch_env.py", out, *HOSTILE, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for rec in read_ranks(out):
        assert rec["argv"] == [str(SCRIPTS / "launch_env.py"), str(out), *HOSTILE]
    assert not (tmp_path / "f").exists() and not (out / "f").exists()


def test_module_mode(tmp_path):
    pkg = tmp_path / "launchmodpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys\nprint('module', __name__, os.environ['RANK'], sys.argv[1:])\n")
    r = dslaunch("run", "--nproc-per-node", 2, "-m", "launchmodpkg.hello", "--config", "a b",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] module __main__ {rank} ['--config', 'a b']" in r.stdout


def test_log_dir_has_one_file_per_rank(tmp_path):
    logs = tmp_path / "logs"
    r = dslaunch("run", "--nproc-per-node", 2, "--log-dir", logs, SCRIPTS / "launch_env.py", tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert (logs / f"rank_{rank}.log").read_text() == f"wrote rank {rank}\n"


def test_max_restarts_reruns_the_whole_job(tmp_path):
    r = dslaunch("run", "--nproc-per-node", 2, "--max-restarts", 1, "--grace-period", 1,
                 SCRIPTS / "launch_fail.py", tmp_path, "once", 1, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "restarting the whole job (restart 1 of 1)" in r.stderr
    assert "first attempt fails" in r.stderr
    assert "[rank 0] attempt 1 ok" in r.stdout and "[rank 1] attempt 1 ok" in r.stdout
    # without --log-dir, the fault's record goes to ./dslaunch-logs (docs/launcher.md)
    record = json.loads((tmp_path / "dslaunch-logs" / "incidents.jsonl").read_text())
    assert record["action"] == "restart" and record["detector"] == "exit"


def test_gloo_all_reduce_through_dslaunch(tmp_path):
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, SCRIPTS / "launch_allreduce.py", env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] allreduce rank={rank} world=2 sum=3" in r.stdout
    assert_no_leftovers(marker)


def test_agent_stops_ranks_when_its_stdin_closes(tmp_path):
    """The multi-host seam: an agent whose launcher/connection vanishes (stdin EOF) stops its ranks."""
    from dslaunch.launcher.plan import build_plan

    marker, env = marker_env()
    plan = build_plan({"localhost": [0, 1]}, program=[str(SCRIPTS / "launch_sleep.py")],
                      grace_period=1.0)
    agent = subprocess.Popen([sys.executable, "-m", "dslaunch.launcher.agent", "--plan", plan.encode(),
                              "--node-rank", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env)
    seen = []
    while sum("ready" in line for line in seen) < 2:
        line = agent.stdout.readline().decode()
        assert line, "agent ended early"
        seen.append(line)
    assert any(line.startswith("@@dslaunch-event ") and '"started"' in line for line in seen)
    agent.stdin.close()
    rest = agent.stdout.read().decode()
    assert agent.wait(timeout=30) != 0
    assert '"event":"done"' in rest
    assert_no_leftovers(marker)


def test_agent_cut_off_from_its_launcher_kills_its_ranks(tmp_path):
    """Fencing: the connection stays open but carries nothing (a split network, where no EOF
    comes): an agent that hears no ping for ``fence_timeout`` s kills its ranks and ends; one that
    keeps hearing pings keeps them running."""
    import time

    from dslaunch.launcher.plan import build_plan

    marker, env = marker_env()
    plan = build_plan({"localhost": [0, 1]}, program=[str(SCRIPTS / "launch_sleep.py")],
                      grace_period=1.0)
    plan.fence_timeout = 2.0
    agent = subprocess.Popen([sys.executable, "-m", "dslaunch.launcher.agent", "--plan", plan.encode(),
                              "--node-rank", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    seen = []
    while sum("ready" in line for line in seen) < 2:
        line = agent.stdout.readline().decode()
        assert line, "agent ended early"
        seen.append(line)
    for _ in range(8):  # 4 s of pings, twice the timeout: the ranks keep running
        agent.stdin.write(b"ping\n")
        agent.stdin.flush()
        time.sleep(0.5)
    assert agent.poll() is None
    rest = agent.stdout.read().decode()  # then silence, stdin still open: the agent fences
    assert agent.wait(timeout=30) != 0
    assert '"event":"done"' in rest and "SIGKILL" in rest
    assert "fencing: no word from the launcher for" in agent.stderr.read().decode()
    agent.stdin.close()
    assert_no_leftovers(marker)


def test_local_launcher_refuses_remote_hosts(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\nnode7 slots=2\n")
    r = dslaunch("run", "-H", hostfile, "--launcher", "local", "--dry-run", SCRIPTS / "launch_env.py",
                 tmp_path)
    assert r.returncode != 0
    assert "the local launcher runs only on this host" in r.stderr and "node7" in r.stderr


def test_agent_without_its_environment_fails_clearly_and_leaves_no_files(tmp_path):
    """A connection that closes before the launcher sent the environment: exit 2, a clear error
    event, and the agent's scratch folder removed (it is made before the environment arrives)."""
    from dslaunch.launcher.plan import build_plan

    plan = build_plan({"localhost": [0]}, program=[str(SCRIPTS / "launch_sleep.py")])
    plan.env_channel = "stdin"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    agent = subprocess.run([sys.executable, "-m", "dslaunch.launcher.agent", "--plan", plan.encode(),
                            "--node-rank", "0"], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, env=dict(os.environ, TMPDIR=str(scratch)), timeout=60)
    assert agent.returncode == 2, agent.stdout + agent.stderr
    assert "the launcher sent no environment" in agent.stdout
    assert list(scratch.iterdir()) == []
