"""A rank under `dslaunch run` has torchrun's whole environment (issue 19, part 4).

The reference is torchrun itself: the same env-dump script (tests/scripts/env_dump.py) runs under
`python -m torch.distributed.run` and under `dslaunch run`, from the same environment, and every
variable torchrun adds must be there with the same value, except the few whose value names this
job (port, run id, error-file path) or that say how the launcher itself works (checked one by one
below). Across hosts: tests/multihost/test_deepspeed_cli_two_hosts.py. And what follows from
torchrun's agent hosting the store where dslaunch's rank 0 does: ranks may use it after rank 0
ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import DSLAUNCH, LAUNCHER_VARS, SCRIPTS

# Values that differ by design, each checked on its own in test_env_matches_torchrun.
PER_JOB = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR",
           "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}


def base_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in list(env):
        if k in LAUNCHER_VARS or k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_")):
            del env[k]
    return env


def dump(cmd: list, out, env: dict) -> list:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads((out / f"rank_{i}.json").read_text()) for i in range(2)]


def compare(torchrun: list, ours: list, env: dict, ignore: tuple = ()) -> None:
    """Rank by rank: every variable torchrun added to ``env`` (a dict, or host -> dict) is set by
    dslaunch too, with the same value unless PER_JOB (those are checked here one by one) or
    starting with one of ``ignore``."""
    for t, d in zip(torchrun, ours, strict=True):
        assert t["host"] == d["host"]
        assert t["torchelastic"] is True and d["torchelastic"] is True
        base = env.get(t["host"], env)
        added = {k: v for k, v in t["env"].items() if base.get(k) != v and not k.startswith(ignore)}
        assert {"TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK",
                "TORCHELASTIC_ERROR_FILE"} <= set(added)  # the reference really sets them
        missing = sorted(set(added) - set(d["env"]))
        assert not missing, f"torchrun sets {missing}, dslaunch does not"
        differ = {k: (v, d["env"][k]) for k, v in added.items()
                  if k not in PER_JOB and d["env"][k] != v}
        assert not differ, differ
        # torchrun's agent hosts the TCP store; ours does not, so rank 0 must create it
        assert (t["env"]["TORCHELASTIC_USE_AGENT_STORE"], d["env"]["TORCHELASTIC_USE_AGENT_STORE"]) \
            == ("True", "False")
        assert set(d["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"].split(",")) \
            <= set(t["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"].split(","))
        # DeepSpeed's launch.py names, with the values its launcher gives them
        assert d["env"]["LOCAL_SIZE"] == d["env"]["LOCAL_WORLD_SIZE"]
        assert d["env"]["CROSS_RANK"] == d["env"]["GROUP_RANK"]
        assert d["env"]["CROSS_SIZE"] == d["env"]["GROUP_WORLD_SIZE"]
    for job in (torchrun, ours):  # one run id per job, one error file per rank
        assert len({r["env"]["TORCHELASTIC_RUN_ID"] for r in job}) == 1
        assert len({r["env"]["TORCHELASTIC_ERROR_FILE"] for r in job}) == len(job)


def test_env_matches_torchrun(tmp_path):
    env = base_env()
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    script = str(SCRIPTS / "env_dump.py")
    torchrun = dump([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                     "--max-restarts", "2", script, str(tmp_path / "t")], tmp_path / "t", env)
    ours = dump([*DSLAUNCH, "run", "--nproc-per-node", "2", "--max-restarts", "2", script,
                 str(tmp_path / "d")], tmp_path / "d", env)
    compare(torchrun, ours, env)
    for t, d in zip(torchrun, ours):
        assert {t["env"]["MASTER_ADDR"], d["env"]["MASTER_ADDR"]} <= {"localhost", "127.0.0.1"}
        assert d["env"]["LOCAL_SIZE"] == "2" and d["env"]["CROSS_SIZE"] == "1"
    assert ours[0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "2"


def test_run_id_option_and_restart_count(tmp_path):
    r = subprocess.run([*DSLAUNCH, "run", "--nproc-per-node", "2", "--run-id", "job-42",
                        str(SCRIPTS / "env_dump.py"), str(tmp_path)], env=base_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for i in range(2):
        env = json.loads((tmp_path / f"rank_{i}.json").read_text())["env"]
        assert env["TORCHELASTIC_RUN_ID"] == "job-42"
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["DSLAUNCH_RESTART_COUNT"] == "0"
        assert env["ROLE_RANK"] == env["RANK"] == str(i) and env["ROLE_WORLD_SIZE"] == "2"


def test_record_error_file_names_the_root_cause(tmp_path):
    """The script swallows its exception after torch's @record wrote it (exit 1, nothing on our
    own error channel): the failure report still names the exception and its traceback, read
    from TORCHELASTIC_ERROR_FILE."""
    r = subprocess.run([*DSLAUNCH, "run", "--nproc-per-node", "2", "--grace-period", "1",
                        str(SCRIPTS / "record_fail.py"), "1"], env=base_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "job failed: rank 1 (host localhost) exited with code 1: RuntimeError: recorded " \
           "failure in rank 1" in r.stderr, r.stderr
    assert "record_fail.py" in r.stderr and "in main" in r.stderr  # @record's py_callstack tail


def test_reserved_torchrun_names_cannot_be_overridden(tmp_path):
    r = subprocess.run([*DSLAUNCH, "run", "--env", "TORCHELASTIC_RUN_ID=x", "--dry-run",
                        str(SCRIPTS / "env_dump.py"), str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "TORCHELASTIC_RUN_ID is set by the launcher for each rank" in r.stderr


def test_ranks_keep_the_store_after_rank_0_ends(tmp_path):
    """torchrun's agent hosts the TCP store; under dslaunch rank 0 does. Rank 0 ends at once while
    ranks 1 and 2 use the store 2 s later (a key, then a group of their own, whose gloo
    rendezvous goes through it): they still reach it (store_linger.py), and rank 0 waited for
    them. Without the wait they failed with "Broken pipe" every time."""
    out = tmp_path / "out"
    r = subprocess.run([*DSLAUNCH, "run", "--nproc-per-node", "3", "--omp-threads", "1",
                        str(SCRIPTS / "late_store_use.py"), "--out", str(out)], env=base_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((out / f"rank_{i}.json").read_text()) for i in range(3)]
    assert [x["sum"] for x in ranks] == [3.0, 3.0, 3.0]
    assert [(x["read"], x["late_sum"]) for x in ranks[1:]] == [("1", 2.0), ("2", 2.0)]


def test_hang_after_rank_0_ended_names_the_ranks_it_waits_for(tmp_path):
    """The same script with the late ranks asleep 8 s under --hang-timeout 3: a hang by the
    watchdog's rule, and the report names ranks 1 and 2 (rank 0's record shows it waiting in
    "exit_wait"), not rank 0."""
    r = subprocess.run([*DSLAUNCH, "run", "--nproc-per-node", "3", "--omp-threads", "1",
                        "--hang-timeout", "3", "--grace-period", "1",
                        str(SCRIPTS / "late_store_use.py"), "--out", str(tmp_path / "out"),
                        "--pause", "8"], env=base_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "job failed: hang: ranks 1,2 never entered exit_wait #1 on job end" in r.stderr, \
        r.stderr[-3000:]
