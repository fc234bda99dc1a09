"""In-process recovery (``dslaunch run --recover in-process``): real jobs on this host, real gloo
groups. A rank killed or hung mid-job is replaced while the others keep their processes and
state; the job trains to the same losses, step by step, as the fault-free run (the data of a step
depends on the step only: tests/scripts/recover_train.py). Layouts that cannot recover in process
fall back to restarting every rank."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from test_launch import assert_no_leftovers, marker_env

from helpers import DSLAUNCH, ROOT, SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "recover_train.py"
STEPS = 10
GAS2 = json.dumps({"gradient_accumulation_steps": 2})


def _losses(out: str) -> dict:
    return {int(s): float(v) for s, v in re.findall(r"\[rank 0\] step (\d+) loss ([\d.]+)", out)}


def _starts(out: str) -> dict:
    """rank -> the pids that printed a start line, in order."""
    found: dict = {}
    for rank, pid in re.findall(r"\[rank \d+\] rank (\d+) pid (\d+) start", out):
        found.setdefault(int(rank), []).append(int(pid))
    return found


def _digests(out: str) -> set:
    """The state digests the ranks printed at the end (one each)."""
    return set(re.findall(r"rank \d+ pid \d+ done (\w+)", out))


def _incidents(tmp_path) -> list:
    path = tmp_path / "logs" / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _fault_free(config: str = "{}") -> dict:
    r = dslaunch("run", "--nproc-per-node", 3, SCRIPT, STEPS, config, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return _losses(r.stdout)


@pytest.mark.parametrize("standby", ["standby", "no_standby"])
def test_killed_rank_is_replaced_and_the_others_keep_their_processes(tmp_path, standby):
    """The replacement is the node's standby promoted, or (DSLAUNCH_RECOVER_STANDBY=0) a process
    started after the fault; before that switch had its own name, it made every rank wait as a
    standby forever."""
    marker, env = marker_env()
    if standby == "no_standby":
        env = {**env, "DSLAUNCH_RECOVER_STANDBY": "0"}
    r = dslaunch("run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 1,
                 "--log-dir", tmp_path / "logs", "--inject", "kill:rank=2,step=4", SCRIPT, STEPS,
                 GAS2, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovering in process: the other 2 ranks keep running, rank 2 starts again" in r.stderr
    assert "recovered in process" in r.stderr and "restarting" not in r.stderr
    starts = _starts(r.stdout)
    assert len(starts[0]) == 1 and len(starts[1]) == 1  # the survivors: one process each
    assert len(starts[2]) == 2 and starts[2][0] != starts[2][1]  # a new process for rank 2
    assert re.search(r"rank 2 pid \d+ start at step 4", r.stdout)  # it joined at the step
    losses = _losses(r.stdout)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses == _fault_free(GAS2)  # the same floats: same state, same data per step
    assert len(_digests(r.stdout)) == 1  # the replacement's model and Adam state: a survivor's
    [inc] = _incidents(tmp_path)
    assert inc["action"] == "in-process" and inc["culprit_rank"] == 2
    assert inc["steps_redone"] == 0 and inc["world_size_after"] == 3
    assert inc["seconds_to_training"] > 0 and inc["restart_seconds"] is not None
    assert_no_leftovers(marker)


def test_hung_rank_is_killed_and_replaced(tmp_path):
    """Rank 0 hangs: its replacement takes the state from the first survivor, rank 1 (rank 0
    sent its own fresh counters to itself once, and the job ran on out of step)."""
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 1,
                 "--hang-timeout", 4, "--log-dir", tmp_path / "logs",
                 "--inject", "hang:rank=0,step=3", SCRIPT, STEPS, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "in-process recovery: killing hung rank 0" in r.stderr
    assert "recovered in process" in r.stderr
    starts = _starts(r.stdout)
    assert len(starts[1]) == 1 and len(starts[2]) == 1 and len(starts[0]) == 2
    assert re.search(r"rank 0 pid \d+ start at step 3", r.stdout)
    losses, expected = _losses(r.stdout), _fault_free()
    del expected[3]  # rank 0 prints the losses: it hung after step 3, before printing it
    assert losses == expected
    assert len(_digests(r.stdout)) == 1
    [inc] = _incidents(tmp_path)
    assert inc["action"] == "in-process" and inc["kind"] == "hang"
    assert inc["reason"].startswith("hang: rank 0 never entered")
    assert_no_leftovers(marker)


def _rank_digests(out: str) -> dict:
    return {int(r): d for r, d in re.findall(r"rank (\d+) pid \d+ done (\w+)", out)}


def _zero_config(stage: int, bf16: bool, extra: str = "") -> str:
    """``extra``: "offload" (offload_optimizer to the CPU), "infinity" (offload_param too) or
    "muon" (the Muon optimizer)."""
    zero = {"stage": stage}
    if stage == 3:  # every parameter partitioned (none kept whole): forward gathers them all
        zero["stage3_param_persistence_threshold"] = 0
    if extra in ("offload", "infinity"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if extra == "infinity":  # ZeRO-Infinity on the host: the parameter shard offloaded too
        zero["offload_param"] = {"device": "cpu"}
    config = {"zero_optimization": zero, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": bf16}}
    if extra == "muon":
        config["optimizer"] = {"type": "Muon", "params": {"lr": 0.01}}
    return json.dumps(config)


@pytest.mark.parametrize("stage,bf16,extra",
                         [(1, False, ""), (2, True, ""), (3, False, ""), (3, True, ""),
                          (2, True, "offload"), (3, False, "offload"), (3, True, "infinity"),
                          (2, False, "muon")],
                         ids=["zero1-fp32", "zero2-bf16", "zero3-fp32", "zero3-bf16",
                              "zero2-bf16-offload", "zero3-fp32-offload", "zero3-bf16-infinity",
                              "zero2-fp32-muon"])
def test_zero_sharded_rank_is_replaced_from_its_buddy_copy(tmp_path, stage, bf16, extra):
    """ZeRO 1-3: the lost rank's shard exists only in its buddy's copy
    (engine/recovery/shard_copies.py); the replacement takes it from there, and every rank ends with
    the digest of its fault-free twin (its shard of fp32 state and Adam moments, bit for bit).
    The kill lands between steps; with gradient accumulation 2 the survivors then fail inside
    the next step's first micro-batch (stage 2 reduces there, stage 3 gathers in its forward:
    the abandoned step's forwards then run dry) and start that step again. In fp32 the copy
    holds the Adam moments (at stages 1-2 the weights are in every rank's model; at stage 3 the
    copy holds the parameter shard too); in bf16 the fp32 masters too. With offload_optimizer
    (ZeRO-Offload) the copy is of the host-side masters and moments the CPU Adam steps, with
    offload_param to the CPU too (ZeRO-Infinity) of the host store's parameter shard; with
    Muon, of its momentum (kept per shard)."""
    marker, env = marker_env()
    config = _zero_config(stage, bf16, extra)
    r = dslaunch("run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 1,
                 "--log-dir", tmp_path / "logs", "--inject", "kill:rank=2,step=4", SCRIPT, STEPS,
                 config, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovered in process" in r.stderr and "restarting" not in r.stderr, r.stderr[-3000:]
    starts = _starts(r.stdout)
    assert len(starts[0]) == 1 and len(starts[1]) == 1 and len(starts[2]) == 2
    ref = dslaunch("run", "--nproc-per-node", 3, SCRIPT, STEPS, config, timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert _losses(r.stdout) == _losses(ref.stdout)
    assert _rank_digests(r.stdout) == _rank_digests(ref.stdout)
    assert len(set(_rank_digests(ref.stdout).values())) == 3  # the shards differ: a real check
    [inc] = _incidents(tmp_path)
    assert inc["action"] == "in-process" and inc["steps_redone"] == 0
    assert_no_leftovers(marker)


def test_zero3_world_shrinks_and_the_shards_are_repartitioned(tmp_path):
    """ZeRO 3, the ranks' side of a world that shrinks (a lost host: the launcher's side needs
    namespace hosts, tests/multihost/test_inprocess_hosts.py): after step 4 rank 2 leaves and
    ranks 0-1 recover in process as a world of 2 (recover_train.py RECOVER_SHRINK_AT). Rank 2's
    parameter and optimizer shard exists only in its buddy's copy (rank 0); the survivors
    re-partition the model over 2 from their shards and that copy. Their losses are those of
    one process trained on the whole global batch with world 3, then 2 (within 1e-6 relative:
    the reductions add in another order)."""
    steps, config = 8, _zero_config(3, False)
    env = dict(os.environ, RECOVER_SHRINK_AT="4")
    r = dslaunch("run", "--nproc-per-node", 3, SCRIPT, steps, config, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 goes on in a world of 2" in r.stdout and "rank 1 goes on in a world of 2" \
        in r.stdout, r.stdout[-3000:]
    ref_env = dict(os.environ, RECOVER_REFERENCE="3@0,2@4")
    ref_env.pop("DSLAUNCH_CONFIG", None)
    ref = subprocess.run([sys.executable, str(SCRIPT), str(steps), config], env=ref_env,
                         capture_output=True, text=True, timeout=240)
    assert ref.returncode == 0, ref.stderr[-3000:]
    losses = _losses(r.stdout)
    expected = {int(s): float(v) for s, v in re.findall(r"step (\d+) loss ([\d.]+)", ref.stdout)}
    assert sorted(losses) == sorted(expected) == list(range(1, steps + 1))
    for step, loss in losses.items():
        assert abs(loss - expected[step]) <= 1e-6 * abs(expected[step]), \
            (step, loss, expected[step])


def test_fault_in_the_scripts_own_allreduce_is_recovered_in_process(tmp_path):
    """The script all-reduces its loss with torch.distributed itself after each step (as most
    training loops log); rank 2 dies right after step 4, so the survivors meet the fault in that
    all-reduce, not in the engine: the bootstrap's wrapper (torch_progress.SCRIPT_HOOKS) starts
    the same recovery, and the job ends as the fault-free one, rank by rank (ZeRO 2, gradient
    accumulation 2: the replacement's shard from its buddy's copy). The loop also all-reduces a
    stop flag before each iteration's first forward: the survivors, whose interrupted all-reduce
    raised StepAbandoned, meet the replacement there (it starts at the loop's top)."""
    marker, env = marker_env()
    env.update(RECOVER_LOG_ALLREDUCE="1", RECOVER_STOP_CHECK="1")
    config = json.dumps({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2})
    r = dslaunch("run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 1,
                 "--log-dir", tmp_path / "logs", "--inject", "kill:rank=2,step=4", SCRIPT, 8,
                 config, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovered in process" in r.stderr and "restarting" not in r.stderr, r.stderr[-3000:]
    ref = dslaunch("run", "--nproc-per-node", 3, SCRIPT, 8, config, env=env, timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert _losses(r.stdout) == _losses(ref.stdout) and len(_losses(r.stdout)) == 8
    assert _rank_digests(r.stdout) == _rank_digests(ref.stdout)
    assert_no_leftovers(marker)


def test_survivor_hung_at_the_same_step_gives_up_at_once(tmp_path):
    """Two faults at once (what benchmarks/bench_resilience.py --parts e --e-kinds kill,hang
    injects in its first attempt: both faults "after=" the same time since the same start): rank 2
    dies and rank 0 hangs outside any collective at the same step. Rank 0 never takes up the
    recovery and the replacement waits for it in the new group: the launcher used to wait
    RECOVER_TIMEOUT (90 s: "rank(s) 0, 2 did not answer within 90 s") with its watchdog muted.
    Now a survivor that has not said "recovering" within the hang timeout is a second fault: the
    job restarts every rank at once, and finishes."""
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 2,
                 "--hang-timeout", 4, "--log-dir", tmp_path / "logs", "--inject",
                 "kill:rank=2,step=4", "--inject", "hang:rank=0,step=4", SCRIPT, 6, env=env,
                 timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovering in process: the other 2 ranks keep running" in r.stderr
    assert ("in-process recovery failed (surviving rank(s) 0 did not take up the recovery within "
            "6 s" in r.stderr), r.stderr[-3000:]
    assert "restarting the whole job (restart 1 of 2)" in r.stderr
    [inc] = _incidents(tmp_path)
    assert inc["action"] == "restart" and "a second fault" in inc["reason"]
    assert inc["detect_seconds"] < 30, inc  # from the kill to giving up: was 90 (RECOVER_TIMEOUT)
    assert_no_leftovers(marker)


def test_zero3_parameters_on_nvme_refuse_and_the_job_restarts_instead(tmp_path):
    """ZeRO 3 with offload_param on NVMe keeps its parameter shard in files, which the shard
    copies do not read: the ranks refuse, say why, and the job restarts every rank."""
    marker, env = marker_env()
    (tmp_path / "nvme").mkdir()
    config = json.dumps({"zero_optimization": {"stage": 3, "offload_param": {
        "device": "nvme", "nvme_path": str(tmp_path / "nvme")}}})
    r = dslaunch("run", "--nproc-per-node", 2, "--recover", "in-process", "--max-restarts", 1,
                 "--log-dir", tmp_path / "logs", "--inject", "kill:rank=1,step=3", SCRIPT, 5,
                 config, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("in-process recovery refused: ZeRO stage 3 here keeps no copy of each rank's "
            "parameter and optimizer shard (offload_param keeps the parameter shard on NVMe, "
            "in files the copies do not read)" in r.stdout + r.stderr), r.stderr[-3000:]
    [inc] = _incidents(tmp_path)  # the record says why the job restarted
    assert inc["action"] == "restart" and "offload_param keeps the parameter shard" in inc["reason"]
    assert "restarting every rank instead" in r.stderr
    assert "restarting the whole job (restart 1 of 1)" in r.stderr
    assert "rank 0 pid" in r.stdout and r.stdout.count("done") == 2
    assert_no_leftovers(marker)


def test_config_section_and_flag_choose_the_recovery():
    from helpers import ROOT

    def planned(*args):
        r = dslaunch("run", "--nproc-per-node", 2, "--dry-run", "--json", *args, SCRIPT, 1)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)["recover"]

    config = ROOT / "configs" / "inprocess_recovery.json"
    assert planned() == "restart"
    assert planned("--config", config) == "in-process"
    assert planned("--config", config, "--recover", "restart") == "restart"  # the flag wins
    bad = dslaunch("run", "--nproc-per-node", 2, "--recover", "later", SCRIPT, 1)
    assert bad.returncode != 0 and "'later' is not one of 'restart', 'in-process'" in bad.stderr


def _means(out: str) -> dict:
    """{(rank, step): the mean loss the script's own all-reduce gave that rank} (as printed)."""
    return {(int(r), int(s)): v for r, s, v in
            re.findall(r"\] rank (\d+) step (\d+) mean loss ([\d.]+)", out)}


def _abandoned(out: str) -> set:
    return {(int(r), int(s)) for r, s in re.findall(r"\] rank (\d+) step (\d+) abandoned", out)}


def _kill_at(cmd: list, env: dict, step: int, rank: int, timeout: int = 300) -> tuple:
    """Run ``cmd`` (a dslaunch job of recover_train.py) and SIGKILL rank ``rank``'s process from
    outside the job once rank 0 has printed step ``step``; (returncode, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines, pid, killed = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            found = re.search(rf"\] rank {rank} pid (\d+) start", line)
            if found and pid is None:
                pid = int(found.group(1))
            if killed is None and f"[rank 0] step {step} loss" in line:
                assert pid is not None, "".join(lines)
                os.kill(pid, signal.SIGKILL)
                killed = pid
        err = proc.stderr.read()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed is not None, "".join(lines)
    return proc.returncode, "".join(lines), err


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_scripts_own_collectives_never_return_a_made_up_value(tmp_path, stage):
    """Issue 45: a DeepSpeed-style loop (data a function of engine.global_steps) all-reduces its
    loss itself after each step and prints the mean, and all-reduces a stop flag at the top of
    each iteration. Rank 2 is killed with SIGKILL from outside the job right after step 10 (the
    survivors then meet the lost peer in the stop check). Every mean any rank prints, survivor or
    replacement, is the fault-free run's for that step; where a value could not be computed the
    loop got ``dslaunch.StepAbandoned`` instead (the survivors, once, at step 11), caught it and ran
    the step again. Survivors keep their processes; the job ends as the fault-free one. Before,
    the interrupted all-reduce returned the rank's own unreduced value."""
    env = dict(os.environ, RECOVER_LOG_ALLREDUCE="1", RECOVER_STOP_CHECK="1", RECOVER_SLEEP="0.3")
    config = json.dumps({"zero_optimization": {"stage": stage}})
    steps = 13
    ref = dslaunch("run", "--nproc-per-node", 3, SCRIPT, steps, config, env=env, timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = _means(ref.stdout)
    assert sorted({s for _, s in expected}) == list(range(1, steps + 1))
    cmd = [*DSLAUNCH, "run", "--nproc-per-node", 3, "--recover", "in-process", "--max-restarts", 1,
           "--log-dir", tmp_path / "logs", SCRIPT, steps, config]
    code, out, err = _kill_at([str(c) for c in cmd], env, step=10, rank=2)
    assert code == 0, err[-3000:]
    assert "recovered in process" in err and "restarting" not in err, err[-3000:]
    got = _means(out)
    wrong = {k: (v, expected[k]) for k, v in got.items() if v != expected[k]}
    assert not wrong, wrong  # every printed value is the fault-free run's for its step
    abandoned = _abandoned(out)
    assert abandoned <= {(0, 11), (1, 11)}, abandoned
    for rank in (0, 1, 2):  # each step's value printed once it stood, by every rank
        assert {s for r, s in got if r == rank} >= set(range(11, steps + 1)), (rank, got)
    starts = _starts(out)
    assert len(starts[0]) == len(starts[1]) == 1 and len(starts[2]) == 2, starts
    assert _losses(out) == _losses(ref.stdout)
