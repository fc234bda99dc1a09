"""`dslaunch run` options of elastic jobs, checked without starting a rank (--dry-run)."""

from __future__ import annotations

import json

import pytest

from helpers import dslaunch


@pytest.fixture
def hostfile(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    hf = tmp_path / "hf"
    hf.write_text("host1 slots=2\nhost2 slots=2\nhost3 slots=2\nhost9 slots=2 spare\n")
    return hf


def plan(tmp_path, *args):
    r = dslaunch("run", "-H", tmp_path / "hf", "--launcher", "ssh", "--dry-run", "--json", *args,
                 "t.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_spares_and_hosts_beyond_max_wait(tmp_path, hostfile):
    p = plan(tmp_path)
    assert [n["host"] for n in p["nodes"]] == ["host1", "host2", "host3"] and p["world_size"] == 6
    assert p["spares"] == {"host9": [0, 1]} and p["nnodes"] == [3, 3]
    p = plan(tmp_path, "--nnodes", "1:2")
    assert [n["host"] for n in p["nodes"]] == ["host1", "host2"] and p["nnodes"] == [1, 2]
    assert list(p["spares"]) == ["host3", "host9"]
    assert plan(tmp_path, "--min_elastic_nodes", "2", "--max_elastic_nodes", "2")["nnodes"] == [2, 2]
    r = dslaunch("run", "-H", hostfile, "--launcher", "ssh", "--dry-run", "--nnodes", "1:2", "t.py",
                 cwd=tmp_path)
    assert "spare host9: slots [0, 1]" in r.stdout and "elastic: 1 to 2 hosts (--nnodes)" in r.stdout


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2:1"], "--nnodes '2:1': need 1 <= MIN <= MAX"),
    (["--nnodes", "x"], "--nnodes 'x': expected N or MIN:MAX"),
    (["--nnodes", "4:5"], "only 3 host(s) selected (host1, host2, host3), fewer than the minimum 4"),
    (["--nnodes", "2", "--min_elastic_nodes", "1"], "--nnodes and --min_elastic_nodes"),
    (["--min_elastic_nodes", "3", "--max_elastic_nodes", "2"], "--min_elastic_nodes 3 is more than"),
    (["--include", "host9"], "--include leaves only spare hosts (host9)"),
])
def test_bad_elastic_options_are_refused(tmp_path, hostfile, args, message):
    r = dslaunch("run", "-H", hostfile, "--launcher", "ssh", "--dry-run", *args, "t.py", cwd=tmp_path)
    assert r.returncode != 0 and message in r.stderr, r.stderr
