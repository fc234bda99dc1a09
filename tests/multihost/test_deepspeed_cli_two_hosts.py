"""Issue 19 parts 4 and 5 across two namespace hosts: a rank's torchrun environment under dslaunch
equals the one torchrun itself gives it when started on both hosts (`torchrun --nnodes 2`), and
DeepSpeed's `--no_ssh --node_rank`, started on each host by hand, forms one job.

The launchers and agents on the hosts must run this checkout's dslaunch, not whatever the venv has
installed: ssh forwards no environment, so every remote command sets PYTHONPATH itself, and
`--python` names a wrapper that does the same for the agents.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from test_runners import reports
from test_torchrun_env import compare

from helpers import ROOT

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def wrapper(jobdir) -> str:
    path = jobdir / "python.sh"
    path.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def on_host(host: str, jobdir, command: list, env: dict | None = None) -> subprocess.Popen:
    """``command`` on ``host`` in ``jobdir`` through plain ssh (as a user would type it there)."""
    sets = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"PYTHONPATH": str(ROOT), **(env or {})}.items())
    line = f"cd {shlex.quote(str(jobdir))} && env {sets} {shlex.join(command)}"
    return subprocess.Popen(["ssh", host, line], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(procs: list, timeout: float = 120) -> list:
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    return outs


def dumps(out) -> list:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(4)]


def test_torchrun_environment_across_hosts(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    script = str(ROOT / "tests" / "scripts" / "env_dump.py")
    # not ./dslaunch: an empty folder of that name in the cwd shadows the package for `python -c`
    t_out, d_out = jobdir / "torchrun_env", jobdir / "dslaunch_env"
    t_out.mkdir()
    d_out.mkdir()
    # the reference: torchrun started on both hosts (static rendezvous at host1)
    port = "29531"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--master-addr", "host1", "--master-port", port, "--max-restarts", "1"]
    results = finish([on_host(h, jobdir, [*torchrun, "--node-rank", str(n), script, str(t_out)],
                              {"OMP_NUM_THREADS": "1"}) for n, h in enumerate(cluster.hosts)])
    assert all(rc == 0 for rc, _, _ in results), results
    # what a plain login on each host has: the base both launchers add to
    base = {}
    for h, (_, env, _) in zip(cluster.hosts, finish([on_host(h, jobdir, ["env", "-0"], {"OMP_NUM_THREADS": "1"})
                                                       for h in cluster.hosts])):
        base[h] = dict(kv.split("=", 1) for kv in env.split("\0") if "=" in kv)
    # ours, from this host, with the default launcher for remote hosts (pdsh: installed here)
    res = cluster.dslaunch("run", "-H", str(hf), "--python", wrapper(jobdir), "--max-restarts", "1",
                           "--dry-run", script, str(d_out), cwd=jobdir)
    assert "launcher: pdsh" in res.stdout, res.stdout + res.stderr
    res = cluster.dslaunch("run", "-H", str(hf), "--python", wrapper(jobdir), "--max-restarts", "1",
                           script, str(d_out), cwd=jobdir, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    theirs, ours = dumps(t_out), dumps(d_out)
    compare(theirs, ours, base, ignore=("SSH_",))  # SSH_*: each connection's own
    for r, d in enumerate(ours):
        env = d["env"]
        assert d["host"] == cluster.hosts[r // 2]
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["CROSS_RANK"], env["CROSS_SIZE"]) \
            == (str(r // 2), "2", str(r // 2), "2")
        assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["LOCAL_SIZE"]) \
            == (str(r), "4", "2", "2")
        assert env["MASTER_ADDR"] == theirs[r]["env"]["MASTER_ADDR"] == "host1"
    cluster.assert_clean(jobdir)


def test_no_ssh_node_rank_by_hand_forms_one_job(cluster, jobdir):
    """`dslaunch run -H hostfile --no_ssh --node_rank N script` typed on host1 (N=0) and host2
    (N=1), as on a cluster without ssh between nodes: one 4-rank job (gloo all_reduce over both
    hosts), each launcher starting and reporting only its own node's ranks."""
    hf = cluster.hostfile(jobdir / "hostfile")
    (jobdir / ".deepspeed_env").write_text("DSL_T_FILE=from .deepspeed_env $(not run)\n")
    cli = [sys.executable, "-m", "dslaunch"]  # DeepSpeed's line, first word changed
    procs = [on_host(h, jobdir, [*cli, "-H", str(hf), "--no_ssh", "--node_rank", str(n),
                                 "--master_addr", "host1", "report.py", "a b"])
             for n, h in enumerate(cluster.hosts)]
    results = finish(procs)
    got = []
    for n, (rc, out, err) in enumerate(results):
        assert rc == 0, out[-3000:] + err[-3000:]
        mine = reports(out)
        assert [r["rank"] for _, r in mine] == [2 * n, 2 * n + 1]  # only its own node's ranks
        got += mine
    for prefix, r in got:
        assert r["host"] == cluster.hosts[r["rank"] // 2] and prefix == f"[{r['host']}:{r['rank']}]"
        assert r["world"] == 4 and r["sum"] == 1 + 2 + 3 + 4 and r["node_rank"] == r["rank"] // 2
        assert r["file_var"] == "from .deepspeed_env $(not run)" and r["args"] == ["a b"]
    cluster.assert_clean(jobdir)
