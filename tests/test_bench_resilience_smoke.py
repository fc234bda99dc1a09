"""benchmarks/bench_resilience.py runs: its options, and a --smoke goodput run (this host, no root:
the same 2-rank job without and with one injected kill, restarted from its checkpoint) writes the
JSON with both runs complete. No figure is checked (numbers come from the benchmark itself)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_benchmarks_smoke import BENCH, load


def test_options():
    br = load("bench_resilience")
    args = br.parse_args([])
    assert args.part_list == ["a", "b", "c", "d"] and args.host_list == [2, 4]
    assert args.scenario_list == ["host-loss", "hang"] and args.peer_list == ["torchrun"]
    assert (args.minutes, args.fault_every, args.hang_timeout) == (4.0, 120.0, 15.0)
    assert br.parse_args(["--smoke"]).part_list == ["b"]
    assert br.parse_args(["--parts", "e"]).part_list == ["e"]  # in-process vs restart, on its own
    for bad in (["--parts", "f"], ["--scenarios", "flood"], ["--hosts", "1"], ["--peers", "deepspeed"]):
        with pytest.raises(SystemExit):
            br.parse_args(bad)
    assert br.rank_line("[host1:0] STEP 0 12 1795725035.529 1") == ("STEP", 0, ["12"], 1795725035.529, 1)
    assert br.rank_line("[rank 0] some other line") is None


@pytest.mark.slow
def test_smoke_goodput(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "bench_resilience.py"), "--smoke", "--steps", "16",
                          "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("resilience-*.json")
    saved = json.loads(path.read_text())
    assert saved == json.loads(out.stdout)
    assert "/" not in saved["command"].split(" ", 1)[1]  # no path of this machine
    good = saved["goodput"]
    assert good["status"] == "ok" and good["steps"] == 16
    clean_run, fault_run = sorted(good["runs"], key=lambda r: r["faults"])
    assert clean_run["rc"] == 0 and clean_run["final_step"] == 16 and clean_run["faults_fired"] == 0
    # the kill fired once, the job restarted once and still reached its last step
    assert fault_run["rc"] == 0 and fault_run["final_step"] == 16
    assert fault_run["faults_fired"] == 1 and fault_run["restarts"] == 1
    assert fault_run["steps_made"] > 16  # the steps after the last checkpoint were made again
    assert good["goodput_ratio"] is not None
    for part in ("recovery", "async_checkpoint", "watchdog_cost"):
        assert saved[part]["status"] == "not run"
