"""In-process recovery of AutoTP jobs (``dslaunch run --recover in-process``,
engine/recovery/tp.py): real jobs on this host, real gloo groups, the tiny Llama of
tests/scripts/autotp_train.py split over TP 2 (tests/scripts/inprocess_autotp_train.py). A killed
rank is replaced while the others keep their processes; the survivors rebuild the TP and data
groups and re-point the split layers and the engine at them, the replacement takes its TP slices
from a data-parallel replica of its TP rank (at ZeRO 1-2 its optimizer shard from its data
group's shard copies), and the job trains to the fault-free run's losses and per-rank state.
Layouts where no live peer holds the lost slices, and a world that changes size, refuse. A run
that meets the known intermittent hang (docs/resilience.md: a survivor never answers, the launcher
falls back to a restart) is run once more."""

from __future__ import annotations

import json
import os

import pytest
from inprocess_checks import assert_replaced_in_process, assert_trained_as_fault_free, incidents, losses
from test_launch import assert_no_leftovers, marker_env

from helpers import SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "inprocess_autotp_train.py"
STEPS = 8


def _config(stage: int, vocab_parallel_head: bool) -> str:
    zero = {"stage": stage}
    if stage == 3:  # every parameter partitioned: forward gathers them all over the data group
        zero["stage3_param_persistence_threshold"] = 0
    return json.dumps({"zero_optimization": zero, "gradient_accumulation_steps": 2,
                       "tensor_parallel": {"autotp_size": 2,
                                           "vocab_parallel_lm_head": vocab_parallel_head}})


# the known intermittent fault (docs/resilience.md): a survivor stays blocked in a TP collective
# of the old group and never answers; the launcher falls back to a restart after the timeout
KNOWN_HANG = "did not answer within"


def _recovering_run(tmp_path, config, lost, env):
    """The faulty job; run once more (a fresh log dir) only when it met the known intermittent
    hang: the second run must recover in process."""
    for attempt in (1, 2):
        logs = tmp_path / f"logs{attempt}"
        r = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, "--recover", "in-process",
                     "--max-restarts", 1, "--log-dir", logs, "--inject", f"kill:rank={lost},step=4",
                     SCRIPT, STEPS, config, env=env, timeout=300)
        if attempt == 2 or KNOWN_HANG not in r.stderr:
            return r, logs


@pytest.mark.parametrize("stage,vocab_parallel_head,lost",
                         [(0, False, 3), (3, False, 3), (1, True, 2)],
                         ids=["zero0", "zero3", "zero1-vocab-parallel-head"])
def test_autotp_rank_is_replaced_in_process(tmp_path, stage, vocab_parallel_head, lost):
    """TP 2 x DP 2, rank 3 (TP rank 1 of data rank 1) killed at step 4: the other ranks keep
    their processes, rank 3's replacement takes rank 1's slices (ZeRO 0: and its Adam state;
    ZeRO 1-3: its own shard from its buddy's copy, rank 1), and every step's loss and every
    rank's final state equal the fault-free run's, bit for bit. Gradient accumulation 2: the
    survivors meet the fault inside the next step's first micro-batch (ZeRO 3: in its forward's
    gathers) and start that step again. With the vocabulary-parallel LM head (its loss holds the
    TP group too) rank 2 (TP rank 0) is the one lost."""
    marker, env = marker_env()
    config = _config(stage, vocab_parallel_head)
    r, logs = _recovering_run(tmp_path, config, lost, env)
    assert_replaced_in_process(r, lost, step=4)
    ref = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, SCRIPT, STEPS, config,
                   timeout=180)
    # the TP ranks' slices differ (and at ZeRO 1-3 the data ranks' shards): a real check
    assert_trained_as_fault_free(r, ref, logs, lost, STEPS, distinct=2 if stage == 0 else 4)
    assert_no_leftovers(marker)


def test_autotp_without_a_data_parallel_replica_refuses(tmp_path):
    """TP 2 x DP 1: no live peer holds the lost rank's slices; the survivor says so and the
    launcher restarts every rank, which then finishes."""
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--omp-threads", 1, "--recover", "in-process",
                 "--max-restarts", 1, "--log-dir", tmp_path / "logs", "--inject",
                 "kill:rank=1,step=3", SCRIPT, 5, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    why = "at TP 2 x DP 1 no live peer holds a lost rank's TP slices"
    assert f"in-process recovery refused: {why}" in r.stdout + r.stderr, r.stderr[-3000:]
    assert "restarting the whole job (restart 1 of 1)" in r.stderr
    [inc] = incidents(tmp_path / "logs")
    assert inc["action"] == "restart" and why in inc["reason"]
    assert sorted(losses(r.stdout)) == list(range(1, 6))
    assert_no_leftovers(marker)


def test_autotp_world_that_shrinks_refuses():
    """The ranks' side of a lost host (the word says one rank fewer; recover_train.py's
    RECOVER_SHRINK_AT drives it the same way): an AutoTP job refuses to go on at another size."""
    env = dict(os.environ, AUTOTP_SHRINK_AT="2")
    r = dslaunch("run", "--nproc-per-node", 4, "--omp-threads", 1, SCRIPT, 4, env=env,
                 timeout=180)
    assert r.returncode != 0
    assert ("in-process recovery refused: the world of an AutoTP job cannot change size in "
            "process (4 -> 3 ranks" in r.stdout + r.stderr), r.stderr[-3000:]
