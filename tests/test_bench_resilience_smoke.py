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


def test_part_e_schedule_is_one_fault_at_a_time_on_the_jobs_clock():
    """(e)'s faults: one every --fault-every s of the job's wall time (at=, once per job), kinds in
    turn, never two at the same time (two coinciding faults cannot be recovered in process)."""
    br = load("bench_resilience")
    from dslaunch.launcher.inject import parse_spec

    specs = br.e_schedule(["kill", "hang"], 40.0, 200.0)
    faults = [parse_spec(s) for s in specs]
    assert [(f["kind"], f["rank"], f["at"]) for f in faults] == [
        ("kill", 1, 40.0), ("hang", 0, 80.0), ("kill", 1, 120.0), ("hang", 0, 160.0), ("kill", 1, 200.0)]
    assert all(f["attempt"] == "all" and "after" not in f for f in faults)
    assert [parse_spec(s)["at"] for s in br.e_schedule(["kill"], 120.0, 100.0)] == [120.0]
    row = br.incident_row({"kind": "rank", "action": "in-process", "detect_seconds": 0.1, "stop_seconds": 0.2,
                           "restart_seconds": 0.3, "load_seconds": 0.4, "seconds_to_training": 1.0,
                           "steps_redone": 0})
    assert row["split"] == {"detect": 0.1, "abort": 0.2, "re-plan": None, "rebuild": 0.3, "state": 0.4}


def test_part_e_times_each_fault_from_the_rank_output():
    """The fault's time is the faulting rank's last STEP line + --step-sleep, the rank taken from
    the launcher's prefix (a promoted standby's script printed the rank it read before promotion);
    a hang's detection (the hang timeout) counts in its time to training."""
    br = load("bench_resilience")
    out = "\n".join([
        "[rank 1] STEP 1 9 100.000 0", "[rank 0] STEP 0 9 100.010 0",
        "[rank 1] dslaunch inject: kill:rank=1,at=10s: rank 1 (pid 5) kills itself (SIGKILL) at step 10",
        "[rank 1] STEP 0 30 200.000 0",  # the replacement, promoted from a standby
        "[rank 0] STEP 0 40 300.000 0",
        "[rank 0] dslaunch inject: hang:rank=0,at=20s: rank 0 (pid 4) hangs in _injected_hang at step 41"])
    fired = br.fired_faults(out, 0.1)
    assert [(f["spec"], f["rank"], f["step"], f["time"]) for f in fired] == [
        ("kill:rank=1,at=10s", 1, 10, 100.1), ("hang:rank=0,at=20s", 0, 41, 300.1)]
    recs = [{"culprit_rank": 1, "time": 100.2, "seconds_to_training": 1.0, "kind": "rank"},
            {"culprit_rank": 0, "time": 304.6, "seconds_to_training": 0.9, "kind": "hang"}]
    rows = [br.incident_row(r) for r in recs]
    br.attach_faults(rows, recs, fired)
    assert (rows[0]["fault"], rows[0]["fault_to_training_s"]) == ("kill:rank=1,at=10s", 1.1)
    assert (rows[1]["fault"], rows[1]["fault_to_detect_s"], rows[1]["fault_to_training_s"]) == (
        "hang:rank=0,at=20s", 4.5, 5.4)


def test_part_a_in_process_phases_from_the_stamped_lines():
    """(a) with --a-recover in-process: rank 0 keeps its process (attempt 0, no INIT), so
    training again is its first step after the fault, and recover_s runs from the launcher's
    "recovering" line to it; the restart path still needs a restarted rank 0 (attempt >= 1)."""
    br = load("bench_resilience")
    assert br.parse_args(["--a-recover", "restart,in-process"]).a_recover_list == ["restart", "in-process"]
    with pytest.raises(SystemExit):
        br.parse_args(["--a-recover", "elastic"])
    job = br.Job([])
    job.lines = [(99.0, "stdout", "[host1:0] STEP 0 12 99.000 0"),
                 # a step rank 0 ended just after rank 1 hung, before anyone noticed: not it
                 (100.001, "stdout", "[host1:0] STEP 0 13 100.001 0"),
                 (104.0, "stderr", "dslaunch: hang: rank 1 never entered all_reduce #40; recovering in process"),
                 (105.0, "stdout", "[host1:0] STEP 0 14 105.000 0")]
    ip = br.phases(job, 100.0, "dslaunch-in-process")
    assert (ip["detect_s"], ip["replan_s"], ip["recover_s"], ip["training_again_s"]) == (4.0, 0.0, 1.0, 5.0)
    assert br.phases(job, 100.0, "dslaunch")["training_again_s"] is None  # no restarted rank 0


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
