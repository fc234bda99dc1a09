"""DeepSpeed's `deepspeed` command line on dslaunch (issue 19, part 5): its flags on `dslaunch run`
and on `python -m dslaunch` without a sub-command, DeepSpeed's choice of launcher, `--no_ssh
--node_rank` (one job from launchers started by hand), core binding, `.deepspeed_env` values.
The same across two namespace hosts: tests/multihost/test_deepspeed_cli.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from dslaunch.cli.deepspeed_flags import launcher_name
from dslaunch.launcher.cores import CoreListError, format_cores, parse_core_list, rank_cores
from helpers import DSLAUNCH, ROOT, SCRIPTS, dslaunch

PY_M = [sys.executable, "-m", "dslaunch"]
DUMP = str(SCRIPTS / "env_dump.py")


def plan_of(*args, cwd=ROOT, env=None) -> dict:
    r = dslaunch("run", *args, "--dry-run", "--json", DUMP, "/nonexistent", cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ranks(out, n=2) -> list:
    return [json.loads((out / f"rank_{i}.json").read_text()) for i in range(n)]


# ---- parsing and selection -------------------------------------------------------------------

def test_core_lists():
    assert parse_core_list("0,2-4, 7,3") == [0, 2, 3, 4, 7]
    assert format_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert rank_cores(1, 2, "0-7") == [4, 5, 6, 7]
    assert rank_cores(2, 3, "0-7") == [4, 5]  # 8 // 3 = 2 each; cores 6 and 7 stay unused
    for bad in ("a", "3-1", "1,,2", "-2"):
        with pytest.raises(CoreListError, match="--bind_core_list"):
            parse_core_list(bad)
    with pytest.raises(CoreListError, match="3 ranks on this host but only 2 core"):
        rank_cores(0, 3, "4-5")


def test_default_launcher_is_deepspeeds_choice(tmp_path):
    assert launcher_name(None, {"localhost": [0, 1]}) == "local"
    assert launcher_name(None, {"localhost": [0], "node7": [0]}) == ("pdsh" if shutil.which("pdsh") else "ssh")
    assert launcher_name("OpenMPI", {"node7": [0]}) == "openmpi"  # DeepSpeed's names, any case
    hf = tmp_path / "hostfile"
    hf.write_text("node7 slots=2\nnode8 slots=2\n")
    if shutil.which("pdsh"):
        assert plan_of("-H", hf)["launcher"] == "pdsh"
    # no pdsh on PATH: OpenSSH (a PATH holding only ssh; the interpreter is called by full path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").symlink_to(shutil.which("ssh"))
    plan = plan_of("-H", hf, env=dict(os.environ, PATH=str(bin_dir)))
    assert plan["launcher"] == "ssh" and plan["commands"][0].startswith("ssh ")


@pytest.mark.parametrize("args, message", [
    (["--launcher", "MVAPICH"], "--launcher MVAPICH: not supported by dslaunch; use mpich"),
    (["--node_rank", "1"], "--node_rank goes with --no_ssh"),
    (["--no_ssh", "--node_rank", "2", "-H", "{hf}"], "--no_ssh needs --node_rank between 0 and 1"),
    (["--no_ssh", "-H", "{hf}"], "--no_ssh needs --node_rank"),
    (["--no_ssh", "--node_rank", "0", "--launcher", "pdsh"], "leave out --launcher"),
    (["--bind_core_list", "0-3"], "--bind_core_list goes with --bind_cores_to_rank"),
    (["--bind_cores_to_rank", "--bind_core_list", "x"], "'x' is not a core number"),
])
def test_bad_deepspeed_flags_are_one_clear_error(tmp_path, args, message):
    hf = tmp_path / "hostfile"
    hf.write_text("node7 slots=2\nnode8 slots=2\n")
    r = dslaunch("run", *[a.format(hf=hf) for a in args], "--dry-run", DUMP, tmp_path)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_deepspeed_spellings_reach_the_plan(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=3\n")
    plan = plan_of("--hostfile", hf, "--exclude", "localhost:0", "--master_addr", "127.0.0.1",
                   "--master_port", 29617, "--bind_cores_to_rank", "--bind_core_list", "0-1")
    assert plan["nodes"][0]["slots"] == [1, 2] and plan["master_port"] == 29617
    assert plan["bind_cores"] is True and plan["bind_core_list"] == "0-1"
    hf.write_text("node7 slots=2\nnode8 slots=2\n")
    plan = plan_of("-H", hf, "--launcher", "ssh", "--ssh_port", 2222, "--no_ssh_check",
                   "--num_nodes", 1, "--num_gpus", 1)
    assert plan["nodes"] == [{"host": "node7", "node_rank": 0, "slots": [0], "ranks": [0]}]
    assert " -p 2222 node7 " in plan["commands"][0]


def test_no_ssh_plans_agree_across_nodes(tmp_path):
    """Every node computes the same whole-job plan (ranks, port, run id) and starts only its own
    agent."""
    hf = tmp_path / "hostfile"
    hf.write_text("node7 slots=2\nnode8 slots=2\n")
    plans = [plan_of("-H", hf, "--no_ssh", "--node_rank", n) for n in (0, 1)]
    for n, plan in enumerate(plans):
        assert plan["launcher"] == "no_ssh" and plan["world_size"] == 4
        assert (plan["master_addr"], plan["master_port"]) == ("node7", 29500)
        assert len(plan["commands"]) == 1 and plan["commands"][0].endswith(f"--node-rank {n}")
    assert plans[0]["run_id"] == plans[1]["run_id"]
    assert plans[0]["run_id"] != plan_of("-H", hf, "--no_ssh", "--node_rank", 0,
                                         "--master_port", 29501)["run_id"]


# ---- end to end ------------------------------------------------------------------------------

def test_deepspeed_command_line_runs_two_ranks_with_env_files(tmp_path):
    """`python -m dslaunch --num_gpus 2 script args` (a `deepspeed` line, first word changed):
    two ranks, script arguments untouched, .deepspeed_env from $HOME and the cwd (and the file
    DS_ENV_FILE names) read as data and set on every rank."""
    home, work, out = tmp_path / "home", tmp_path / "work", tmp_path / "out"
    for d in (home, work, out):
        d.mkdir()
    literal = "a=b $(touch pwned) `touch pwned2` 'q' \"dq\" $HOME"
    (home / ".deepspeed_env").write_text("DSL_T_HOME=from-home\nDSL_T_BOTH=home\n")
    (work / ".deepspeed_env").write_text(f"DSL_T_BOTH=cwd\nDSL_T_LITERAL={literal}\n")
    env = dict(os.environ, HOME=str(home), OMP_NUM_THREADS="1")
    r = subprocess.run([*PY_M, "--num_gpus", "2", DUMP, str(out), "--deepspeed", "--lr=3"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for i, rec in enumerate(ranks(out)):
        assert rec["argv"] == [str(out), "--deepspeed", "--lr=3"]
        assert rec["env"]["RANK"] == str(i) and rec["env"]["WORLD_SIZE"] == "2"
        assert rec["env"]["DSL_T_HOME"] == "from-home" and rec["env"]["DSL_T_BOTH"] == "cwd"
        assert rec["env"]["DSL_T_LITERAL"] == literal
    assert not list(work.glob("pwned*"))
    (work / "other.env").write_text("DSL_T_OTHER=named\n")
    r = subprocess.run([*PY_M, "--num_gpus", "2", DUMP, str(out)], cwd=work,
                       env=dict(env, DS_ENV_FILE="other.env"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for rec in ranks(out):
        assert rec["env"]["DSL_T_OTHER"] == "named" and "DSL_T_LITERAL" not in rec["env"]


def test_bind_cores_to_rank_pins_each_rank(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 usable cores")
    r = dslaunch("run", "--nproc-per-node", 2, "--bind_cores_to_rank", DUMP, tmp_path)
    assert r.returncode == 0, r.stderr
    per = len(cores) // 2
    for i, rec in enumerate(ranks(tmp_path)):
        assert rec["cpus"] == cores[i * per:(i + 1) * per]
        assert rec["env"]["OMP_NUM_THREADS"] == str(per)
    r = dslaunch("run", "--nproc-per-node", 2, "--bind_cores_to_rank", "--bind_core_list",
                 str(cores[0]), DUMP, tmp_path)
    assert r.returncode != 0
    assert "2 ranks on this host but only 1 core(s) to share" in r.stderr, r.stderr


def test_no_ssh_launchers_started_by_hand_form_one_job(tmp_path):
    """Two launchers, each told its --node_rank, reach no other host and make one 2-rank job
    (gloo all_reduce over both). Both "hosts" are this one here; the namespace version is in
    tests/multihost."""
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    from dslaunch.launcher.plan import free_port

    port = str(free_port())
    procs = [subprocess.Popen([*DSLAUNCH, "run", "-H", str(hf), "--no_ssh", "--node_rank", str(n),
                               "--master_port", port, str(SCRIPTS / "launch_allreduce.py")],
                              cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for n, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out + err
        assert f"allreduce rank={n} world=2 sum=3" in out, out
