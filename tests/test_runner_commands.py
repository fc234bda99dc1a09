"""Pure logic of the multi-host runners (no hosts needed): the commands they build, how the nodeshim
finds its node, SLURM's task counts, the sbatch script, and how probe answers are judged. The
end-to-end proofs are in tests/multihost/."""

from __future__ import annotations

import shlex
import subprocess

import click
import pytest

from dslaunch.cli.sbatch import render_script
from dslaunch.launcher import hosts_check
from dslaunch.launcher.plan import ENV_VAR, WorldPlan, build_plan, decode_env
from dslaunch.launcher.runners import get_runner
from dslaunch.launcher.runners.base import RunnerError
from dslaunch.launcher.runners.nodeshim import node_rank
from dslaunch.launcher.runners.slurm import _tasks_per_node

HOSTILE = ["it's", "$(touch f)", "`touch g`", "$HOME", "a\nb", " sp ", "100%n"]


def plan(launcher="ssh", python="/opt/py 3/bin/python"):
    return build_plan({"host1": [0, 1], "host2": [0, 1]}, program=["train.py", *HOSTILE],
                      launcher=launcher, master_port=29500, env={"V": "$(x)"}, cwd="/w 1",
                      python=python)


def test_ssh_command_quotes_only_our_words():
    r = get_runner("ssh")(plan(), {"ssh_port": 2222, "ssh_args": "-o 'ProxyJump=gw 1'"})
    argv = r.agent_specs()[1]["argv"]
    assert argv[:1] == ["ssh"] and "2222" in argv and "ProxyJump=gw 1" in argv
    assert argv[argv.index("--") - 1] == "host2"
    remote = argv[-1]
    words = shlex.split(remote)
    assert words[0] == "exec" and words[1] == "/opt/py 3/bin/python"
    assert words[-2:] == ["--node-rank", "1"]
    decoded = WorldPlan.decode(words[words.index("--plan") + 1])
    # the environment is not in the command line: it goes over the agent's stdin (hand_over)
    assert decoded.program == ["train.py", *HOSTILE] and decoded.env == {}
    assert decoded.env_channel == "stdin" and r.notices() == []
    for h in HOSTILE[:3]:
        assert h not in remote


def test_environment_stays_out_of_every_argv_but_pdsh():
    p = build_plan({"host1": [0], "host2": [0]}, program=["t.py"], launcher="mpich",
                   master_port=29500, env={"HF_TOKEN": "hf_s3cret", "V": "1"})
    mpich = get_runner("mpich")(p, {})
    mpich.binary = lambda: "mpiexec.mpich"
    spec = mpich.agent_specs()[0]
    assert "hf_s3cret" not in " ".join(spec["argv"]) and mpich.notices() == []
    blob = spec["popen_kwargs"]["env"][ENV_VAR]  # hydra forwards mpiexec's environment
    assert decode_env(blob) == {"HF_TOKEN": "hf_s3cret", "V": "1"}
    pdsh = get_runner("pdsh")(p, {})
    words = shlex.split(pdsh.agent_specs()[0]["argv"][-1])
    assert WorldPlan.decode(words[words.index("--plan") + 1]).env["HF_TOKEN"] == "hf_s3cret"
    assert len(pdsh.notices()) == 1 and "HF_TOKEN" in pdsh.notices()[0]


def test_bad_ssh_args():
    with pytest.raises(RunnerError, match="--ssh-args"):
        get_runner("ssh")(plan(), {"ssh_args": "-o 'unclosed"}).validate()


def test_pdsh_command_uses_node_index_and_escapes_percent():
    p = plan("pdsh", python="/opt/50%/python")
    spec = get_runner("pdsh")(p, {"pdsh_fanout": 4}).agent_specs()[0]
    argv = spec["argv"]
    assert argv[:7] == ["pdsh", "-S", "-N", "-R", "ssh", "-w", "host1,host2"]
    assert argv[argv.index("-f") + 1] == "4"
    words = shlex.split(argv[-1])
    assert words[1] == "/opt/50%%/python" and words[-1] == "%n"
    assert spec["node_ranks"] == [0, 1]
    assert spec["popen_kwargs"]["env"]["PDSH_RCMD_TYPE"] == "ssh"


def test_pdsh_refuses_ssh_args_with_spaces():
    r = get_runner("pdsh")(plan("pdsh"), {"ssh_args": "-o 'ProxyCommand=nc %h 22'"})
    with pytest.raises(RunnerError, match="splits its ssh arguments on spaces"):
        r.validate()


def test_mpi_commands_one_agent_per_node():
    p = plan("openmpi")
    ompi = get_runner("openmpi")(p, {"launcher_args": "--mca btl_tcp_if_include eth0"})
    ompi.binary = lambda: "mpirun"
    argv = ompi.agent_specs()[0]["argv"]
    assert argv[argv.index("-np") + 1] == "2" and "ppr:1:node" in argv and "all" in argv
    assert argv[argv.index("--host") + 1] == "host1:1,host2:1"
    assert "btl_tcp_if_include" in argv
    assert argv[argv.index("--rank-from") + 1] == "openmpi"
    mpich = get_runner("mpich")(plan("mpich"), {})
    mpich.binary = lambda: "mpiexec.mpich"
    argv = mpich.agent_specs()[0]["argv"]
    assert argv[:7] == ["mpiexec.mpich", "-n", "2", "-ppn", "1", "-hosts", "host1,host2"]
    assert argv[argv.index("--rank-from") + 1] == "mpich"


def test_nodeshim_node_rank():
    p = plan()
    assert node_rank(p, "openmpi", {"OMPI_COMM_WORLD_RANK": "1"}) == 1
    assert node_rank(p, "mpich", {"PMI_RANK": "0"}) == 0
    assert node_rank(p, "slurm", {"SLURMD_NODENAME": "host2"}) == 1
    with pytest.raises(SystemExit, match="not in the plan"):
        node_rank(p, "slurm", {"SLURMD_NODENAME": "host9"})
    with pytest.raises(SystemExit, match="PMI_RANK is not set"):
        node_rank(p, "mpich", {})
    with pytest.raises(SystemExit, match="plan has 2 node"):
        node_rank(p, "openmpi", {"OMPI_COMM_WORLD_RANK": "2"})


def test_slurm_tasks_per_node():
    assert _tasks_per_node({"SLURM_TASKS_PER_NODE": "2(x3),1"}) == [2, 2, 2, 1]
    assert _tasks_per_node({}) == []


def test_slurm_outside_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(RunnerError, match="dslaunch sbatch"):
        get_runner("slurm")(plan("slurm"), {}).validate()


def test_sbatch_script_round_trips_arguments(tmp_path):
    args = ["--env", "V=it's $(touch f)", "train.py", *HOSTILE, "--config", "x y.json"]
    text = render_script([("job-name", "j"), ("nodes", 2)], "/w 1", args, ["/usr/bin/dslaunch"])
    assert text.splitlines()[1:3] == ["#SBATCH --job-name=j", "#SBATCH --nodes=2"]
    assert "cd '/w 1'" in text
    last = text.split("\n/usr/bin/dslaunch run", 1)[1]  # (a quoted newline spans lines)
    # what bash would pass to dslaunch: every word intact, nothing expanded or run
    probe = 'printf "%s\\0"' + last
    out = subprocess.run(["bash", "-c", f'hostfile=HF; {probe}'], capture_output=True, cwd=tmp_path)
    words = out.stdout.decode().split("\0")[:-1]
    assert words == ["--launcher", "slurm", "-H", "HF", *args]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(click.UsageError, match="no spaces"):
        render_script([("job-name", "a b")], "/w", ["t.py"], ["d"])
    with_h = render_script([], "/w", ["-H", "hf", "t.py"], ["d"])
    assert "scontrol" not in with_h and with_h.rstrip().endswith("exec d run --launcher slurm -H hf t.py")


def test_judge_flags_mismatch_and_missing():
    local = {"python": "3.11.7", "torch": "2.13.0", "dslaunch": "0.1.0"}
    res = hosts_check.judge([
        {"host": "a", "status": "ok", "python": "3.11.7", "torch": "2.13.0", "dslaunch": "0.1.0",
         "clock_offset": 0.01},
        {"host": "b", "status": "ok", "python": "3.11.7", "torch": "2.12.0", "dslaunch": "0.1.0",
         "clock_offset": 5.0, "script_ok": False},
        {"host": "c", "status": "ok", "python": "3.11.7", "torch": None, "dslaunch": None,
         "dslaunch_error": "ModuleNotFoundError: x"},
        {"host": "d", "status": "down", "reason": "ssh failed"},
    ], local, need_script=True)
    st = {r["host"]: r["status"] for r in res}
    assert st == {"a": "ok", "b": "mismatch", "c": "no-dslaunch", "d": "down"}
    b = res[1]
    assert "torch 2.12.0 (here 2.13.0)" in b["reason"] and "script missing" in b["reason"]
    assert "clock off" in b["warning"]
