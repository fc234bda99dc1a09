"""`dslaunch hosts check` and the preflight of `dslaunch run`: a host that is down, one where
dslaunch is not installed (host3: its venv's site-packages hidden by a tmpfs in its own mount
namespace), a bad interpreter path, and healthy hosts."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.multihost]


def test_hosts_check_reports_each_kind(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 2, "host2": 2, cluster.bare: 2,
                                                cluster.down_addr: 1})
    res = cluster.dslaunch("hosts", "check", "-H", str(hf), "--json", "--timeout", "8", cwd=jobdir)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    by = {r["host"]: r for r in doc["hosts"]}
    assert [r["host"] for r in doc["hosts"]] == ["host1", "host2", cluster.bare, cluster.down_addr]
    for h in ("host1", "host2"):
        assert by[h]["status"] == "ok", by[h]
        assert by[h]["hostname"] == h
        assert by[h]["dslaunch"] == doc["local"]["dslaunch"] and by[h]["torch"] == doc["local"]["torch"]
        assert by[h]["mem_free"] > 0 and by[h]["disk_free"] > 0 and by[h]["gpus"] == 0
        assert isinstance(by[h]["clock_offset"], float)
    assert by["host1"]["port_free"] is True  # checked on the first host only
    assert by[cluster.bare]["status"] == "no-dslaunch"
    assert "No module named 'dslaunch'" in by[cluster.bare]["reason"]
    assert by[cluster.down_addr]["status"] == "down"
    assert by[cluster.down_addr]["reason"]
    assert not doc["ok"]
    cluster.assert_clean(jobdir, wait=5)


def test_hosts_check_table_and_healthy_exit_zero(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("hosts", "check", "-H", str(hf), cwd=jobdir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "host1" in res.stdout and "host2" in res.stdout and "ok" in res.stdout


def test_hosts_check_bad_python(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1})
    res = cluster.dslaunch("hosts", "check", "-H", str(hf), "--json", "--python", "/nonexistent/python3",
                           cwd=jobdir)
    assert res.returncode == 1
    r = json.loads(res.stdout)["hosts"][0]
    assert r["status"] == "no-python" and "/nonexistent/python3" in r["reason"]


def test_preflight_refuses_host_without_dslaunch(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1, cluster.bare: 1})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "report.py", cwd=jobdir)
    assert res.returncode == 1
    assert "preflight failed on 1 of 2 host(s): host3 (no-dslaunch)" in res.stderr
    assert "REPORT" not in res.stdout  # no rank started anywhere
    cluster.assert_clean(jobdir, wait=5)


def test_preflight_missing_script_and_down_host(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile", {"host1": 1, "host2": 1})
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "pdsh", "no_such_script.py", cwd=jobdir)
    assert res.returncode == 1
    assert "preflight failed on 2 of 2 host(s)" in res.stderr and "script missing" in res.stderr
    hf2 = cluster.hostfile(jobdir / "hostfile2", {"host1": 1, cluster.down_addr: 1})
    res = cluster.dslaunch("run", "-H", str(hf2), "--launcher", "ssh", "--preflight-timeout", "8",
                           "report.py", cwd=jobdir)
    assert res.returncode == 1
    assert f"{cluster.down_addr} (down)" in res.stderr
    cluster.assert_clean(jobdir, wait=5)
