"""A real 2-host x 2-slot job through every runner: gloo all_reduce across the fake hosts, each rank
reports its host, rank and the propagated variables, and hostile argv/env values arrive
byte-identical with nothing executed anywhere. A token from the env file reaches the ranks without
showing in any process's command line (except with pdsh, which says so)."""

from __future__ import annotations

import json
import shlex

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

HOSTILE_ARGS = ["it's", "$(touch f_arg)", "`touch g_arg`", "$HOME", "two\nlines", "a  b ", "--config", ""]
HOSTILE_ENV = "it's $(touch f_env) `touch g_env` $HOME\nline2  end "
FILE_VALUE = "x=$(touch f_file) 'q' \"dq\" `touch g_file` $HOME"
TOKEN = "hf_" + "7c0ffee" * 4
ENV_FILE = f"DSL_T_FILE={FILE_VALUE}\nDSL_T_TOKEN={TOKEN}\n"
CREATED = ["f_arg", "g_arg", "f_env", "g_env", "f_file", "g_file"]

# What each runner needs on these fake hosts (see INFRA.md): Open MPI must keep off the VM's own
# eth0, hydra must tell its proxies to call back on the bridge.
RUNNER_ENV = {
    "openmpi": {"OMPI_MCA_oob_tcp_if_include": "198.51.100.0/24",
                "OMPI_MCA_btl_tcp_if_include": "198.51.100.0/24"},
}
RUNNER_ARGS = {"mpich": ["--launcher-args", "-iface dsl-br0"]}


def reports(stdout: str) -> list:
    out = []
    for line in stdout.splitlines():
        if "REPORT " in line:
            prefix, _, payload = line.partition("REPORT ")
            out.append((prefix.strip(), json.loads(payload)))
    return sorted(out, key=lambda x: x[1]["rank"])


def check_job(res, jobdir, token_private=True):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = reports(res.stdout)
    assert [r["rank"] for _, r in got] == [0, 1, 2, 3], res.stdout
    expect_host = {0: "host1", 1: "host1", 2: "host2", 3: "host2"}
    for prefix, r in got:
        assert r["host"] == expect_host[r["rank"]]
        assert prefix == f"[{r['host']}:{r['rank']}]"
        assert r["local_rank"] == r["rank"] % 2 and r["node_rank"] == r["rank"] // 2
        assert r["world"] == 4 and r["sum"] == 1 + 2 + 3 + 4
        assert r["var"] == HOSTILE_ENV
        assert r["file_var"] == FILE_VALUE
        assert r["args"] == HOSTILE_ARGS
        assert r["ompi_rank"] is None  # the MPI runtime's per-process rank does not leak to ranks
        assert r["token"] == TOKEN and r["plan_env"] is None
        assert r["token_in_argv"] is not token_private, "the environment showed in an argv"
    for name in CREATED:
        assert not (jobdir / name).exists(), f"{name} was created: a value was run by a shell"


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi", "mpich"])
def test_two_hosts_allreduce_env_and_hostile_args(cluster, jobdir, launcher):
    (jobdir / ".dslaunch_env").write_text(ENV_FILE)
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", launcher, *RUNNER_ARGS.get(launcher, []),
                           "--env", f"DSL_T_VAR={HOSTILE_ENV}", "report.py", *HOSTILE_ARGS,
                           cwd=jobdir, env=RUNNER_ENV.get(launcher))
    check_job(res, jobdir, token_private=launcher != "pdsh")
    assert ("DSL_T_TOKEN travel(s) inside the agents' command line" in res.stderr) \
        is (launcher == "pdsh")
    cluster.assert_clean(jobdir)


def test_slurm_srun_inside_allocation(slurm, jobdir):
    (jobdir / ".dslaunch_env").write_text(ENV_FILE)
    hf = slurm.hostfile(jobdir / "hostfile")
    res = slurm.dslaunch("run", "-H", str(hf), "--launcher", "slurm", "--env", f"DSL_T_VAR={HOSTILE_ENV}",
                         "report.py", *HOSTILE_ARGS, cwd=jobdir, timeout=180,
                         prefix=["salloc", "--quiet", "-N2", "-w", "host1,host2", "--ntasks-per-node=2"])
    check_job(res, jobdir)
    slurm.assert_clean(jobdir)


def test_slurm_without_hostfile_uses_the_allocation(slurm, jobdir):
    """No -H inside salloc: the allocation's nodes and tasks per node are the plan."""
    (jobdir / ".dslaunch_env").write_text(ENV_FILE)
    res = slurm.dslaunch("run", "--launcher", "slurm", "--env", f"DSL_T_VAR={HOSTILE_ENV}",
                         "report.py", *HOSTILE_ARGS, cwd=jobdir,
                         timeout=180, prefix=["salloc", "--quiet", "-N2", "-w", "host1,host2",
                                              "--ntasks-per-node=2"])
    check_job(res, jobdir)
    slurm.assert_clean(jobdir)


def test_slurm_outside_allocation_is_a_clear_error(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "slurm", "report.py", cwd=jobdir,
                           env={"SLURM_JOB_ID": ""})
    assert res.returncode == 1
    assert "inside a SLURM allocation" in res.stderr and "dslaunch sbatch" in res.stderr


def test_dry_run_shows_quoted_commands_and_starts_nothing(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--dry-run", "--json",
                           "--env", f"DSL_T_VAR={HOSTILE_ENV}", "report.py", "it's", cwd=jobdir)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["launcher"] == "ssh" and plan["master_addr"] == "host1"
    assert [n["host"] for n in plan["nodes"]] == ["host1", "host2"]
    assert plan["env"]["DSL_T_VAR"] == HOSTILE_ENV
    cmd = shlex.split(plan["commands"][1])
    assert cmd[0] == "ssh" and "host2" in cmd
    # the remote command holds only our words; the user's values are inside the base64 plan
    assert "it's" not in plan["commands"][1] and "touch" not in plan["commands"][1]
    cluster.assert_clean(jobdir, wait=0)


def _check_long_lines(res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    body = ("é" * 700 + "x" * 1300) * 2
    seen = set()
    for line in res.stdout.splitlines():
        if "LONG " in line:
            prefix, _, text = line.partition("LONG ")
            rank, i, rest = text.split(" ", 2)
            assert rest == body + " END", f"rank {rank} line {i} arrived cut or mixed: {line[:200]}"
            assert prefix.strip() == f"[host{int(rank) // 2 + 1}:{rank}]"
            seen.add((int(rank), int(i)))
    assert seen == {(r, i) for r in range(4) for i in range(150)}


@pytest.mark.parametrize("launcher", ["ssh", "openmpi", "mpich"])
def test_long_lines_arrive_whole(cluster, jobdir, launcher):
    """Open MPI forwards chunks that end anywhere, mixing the nodes' lines (runners/mpi.py)."""
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", launcher,
                           *RUNNER_ARGS.get(launcher, []), "long_lines.py",
                           cwd=jobdir, env=RUNNER_ENV.get(launcher))
    _check_long_lines(res)
    cluster.assert_clean(jobdir)


def test_long_lines_arrive_whole_through_srun(slurm, jobdir):
    """srun forwards lines of up to 1024 bytes whole and cuts longer ones, which then mix with the
    other node's output: the agents frame long lines (events.frame) so that nothing is lost."""
    hf = slurm.hostfile(jobdir / "hostfile")
    res = slurm.dslaunch("run", "-H", str(hf), "--launcher", "slurm", "long_lines.py", cwd=jobdir,
                         timeout=180,
                         prefix=["salloc", "--quiet", "-N2", "-w", "host1,host2", "--ntasks-per-node=2"])
    _check_long_lines(res)
    slurm.assert_clean(jobdir)
