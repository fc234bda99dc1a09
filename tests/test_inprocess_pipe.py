"""In-process recovery of pipeline jobs (``dslaunch run --recover in-process``,
engine/recovery/pipe.py): real jobs on this host, real gloo groups, the tiny GPT of
tests/scripts/pipe_model.py as a PipelineModule over PP 2 x DP 2, its embedding tied to the head
(tests/scripts/inprocess_pipe_train.py). A killed rank is replaced while the others keep their
processes; the survivors meet the fault inside the next train_batch, rebuild the grid's groups,
and train that batch again; the replacement takes its stage from a data-parallel replica (at
ZeRO 1 its optimizer shard from its data group's shard copies), and the job trains to the
fault-free run's losses and per-rank state. PP x DP 1 refuses (no live peer holds the lost
stage), and so does a world that changes size."""

from __future__ import annotations

import json
import os

import pytest
from inprocess_checks import assert_replaced_in_process, assert_trained_as_fault_free, incidents, losses
from test_launch import assert_no_leftovers, marker_env

from helpers import SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "inprocess_pipe_train.py"
STEPS = 6


@pytest.mark.parametrize("stage,fault,lost,data", [(0, "hang", 2, "iter"), (1, "kill", 1, "loader")],
                         ids=["zero0-last-stage-hung", "zero1-first-stage-killed-own-loader"])
def test_pipeline_rank_is_replaced_in_process(tmp_path, stage, fault, lost, data):
    """PP 2 x DP 2, gradient accumulation 2, a rank lost in its update of step 3: the survivors
    meet the fault inside the next train_batch (p2p, gradient or loss collectives), recover and
    train that batch again; the other ranks keep their processes, the replacement takes its stage
    (weights, Adam state or at ZeRO 1 its shard, counters) from its data-parallel replica, and
    every step's loss and every rank's final state equal the fault-free run's, bit for bit.
    ZeRO 0 with a step-indexed iterator given to train_batch, a last-stage rank hung (the hang
    watchdog names it from its data-parallel partner's wait; the launcher kills it, then
    recovers); ZeRO 1 with the engine's own loader (the replacement's moved on to its step), a
    first-stage rank killed."""
    marker, env = marker_env()
    env = {**env, "PIPE_DATA": data}
    config = json.dumps({"zero_optimization": {"stage": stage}})
    logs = tmp_path / "logs"
    hang = ["--hang-timeout", 4] if fault == "hang" else []
    r = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, "--recover", "in-process",
                 "--max-restarts", 1, *hang, "--log-dir", logs, "--inject",
                 f"{fault}:rank={lost},step=3", SCRIPT, STEPS, config, env=env, timeout=240)
    assert_replaced_in_process(r, lost, step=3)
    ref = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, SCRIPT, STEPS, config,
                   env={**os.environ, "PIPE_DATA": data}, timeout=180)
    # the stages differ (and at ZeRO 1 the data ranks' shards): a real check
    assert_trained_as_fault_free(r, ref, logs, lost, STEPS, distinct=2 if stage == 0 else 4)
    assert_no_leftovers(marker)


def test_pipeline_without_a_data_parallel_replica_refuses(tmp_path):
    """PP 2 x DP 1: no live peer holds the lost rank's stage; the survivor says so and the
    launcher restarts every rank, which then finishes."""
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--omp-threads", 1, "--recover", "in-process",
                 "--max-restarts", 1, "--log-dir", tmp_path / "logs", "--inject",
                 "kill:rank=1,step=2", SCRIPT, 4, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    why = "at PP 2 x DP 1 no live peer holds a lost rank's pipeline stage"
    assert f"in-process recovery refused: {why}" in r.stdout + r.stderr, r.stderr[-3000:]
    assert "restarting the whole job (restart 1 of 1)" in r.stderr
    [inc] = incidents(tmp_path / "logs")
    assert inc["action"] == "restart" and why in inc["reason"]
    assert sorted(losses(r.stdout)) == list(range(1, 5))
    assert_no_leftovers(marker)


def test_pipeline_world_that_shrinks_refuses():
    """The ranks' side of a lost host (the word says one rank fewer; shrink_world.py drives it):
    a pipeline job refuses to go on at another size."""
    env = dict(os.environ, PIPE_SHRINK_AT="2")
    r = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, SCRIPT, 3, env=env,
                 timeout=180)
    assert r.returncode != 0
    assert ("in-process recovery refused: the world of a pipeline job cannot change size in "
            "process (4 -> 3 ranks: the PP 2 x DP 2 grid and its stages would change)"
            in r.stdout + r.stderr), r.stderr[-3000:]
