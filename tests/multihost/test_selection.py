"""--include / --exclude / --num-nodes / --nproc-per-node pick the right slots on the right hosts:
the plan (--dry-run --json) names the slots, and a real job shows where each rank ran."""

from __future__ import annotations

import json

import pytest
from test_runners import reports

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def plan_of(cluster, jobdir, *sel):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 2, "host2": 2})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", *sel, "--dry-run", "--json",
                           "report.py", cwd=jobdir)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("sel,nodes", [
    (["-i", "host1:1@host2:0"], [("host1", [1], [0]), ("host2", [0], [1])]),
    (["-i", "host2"], [("host2", [0, 1], [0, 1])]),
    (["-e", "host1:0"], [("host1", [1], [0]), ("host2", [0, 1], [1, 2])]),
    (["-e", "host1"], [("host2", [0, 1], [0, 1])]),
    (["--num-nodes", "1"], [("host1", [0, 1], [0, 1])]),
    (["--nproc-per-node", "1"], [("host1", [0], [0]), ("host2", [0], [1])]),
])
def test_plan_slots(cluster, jobdir, sel, nodes):
    plan = plan_of(cluster, jobdir, *sel)
    assert [(n["host"], n["slots"], n["ranks"]) for n in plan["nodes"]] == nodes
    assert plan["world_size"] == sum(len(s) for _, s, _ in nodes)
    assert plan["master_addr"] == nodes[0][0]


@pytest.mark.parametrize("sel,where", [
    (["-i", "host1:1@host2:0"], {0: "host1", 1: "host2"}),
    (["-e", "host1"], {0: "host2", 1: "host2"}),
])
def test_ranks_run_where_selected(cluster, jobdir, sel, where):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 2, "host2": 2})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", *sel, "report.py", cwd=jobdir)
    assert res.returncode == 0, res.stderr[-2000:]
    got = {r["rank"]: r["host"] for _, r in reports(res.stdout)}
    assert got == where
    assert all(r["world"] == len(where) and r["sum"] == sum(range(1, len(where) + 1))
               for _, r in reports(res.stdout))
    cluster.assert_clean(jobdir)


@pytest.mark.parametrize("sel,needle", [
    (["-i", "host9"], "--include: unknown host 'host9'"),
    (["-i", "host1:5"], "host 'host1' has no slot 5"),
    (["-i", "host1", "-e", "host2"], "--include and --exclude cannot be used together"),
    (["-i", "host1", "--num-nodes", "1"], "--num-nodes cannot be used together with --include"),
])
def test_bad_selection_is_one_clear_line(cluster, jobdir, sel, needle):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 2, "host2": 2})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", *sel, "report.py", cwd=jobdir)
    assert res.returncode == 1
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    cluster.assert_clean(jobdir, wait=0)


def test_bad_hostfile_names_file_and_line(cluster, jobdir):
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=two\n")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "report.py", cwd=jobdir)
    assert res.returncode == 1
    assert f"{hf}:2: slot count 'two' for host 'host2' is not an integer" in res.stderr
