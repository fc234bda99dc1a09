"""Pipeline parallelism end to end: real gloo jobs through `dslaunch run`, the tiny GPT as
PipelineModule layers (tests/scripts/pipe_model.py), compared with a plain single-process
PyTorch run of the same layers (same per-layer seeds, same batches, AdamW) within 1e-5 relative.
"""

import json

from helpers import launch, results

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
STEPS = 3


def _cfg(micro, gas, **extra):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, **extra}


def _reference(job_cache, batch, *flags):
    """The plain single-process run (pipe_train.py --reference), once per session: tests here and
    in the other pipe/TP files that ask for the same reference share it."""
    job = job_cache.python("pipe_ref", "pipe_train.py", "--reference", "--out", "{dir}",
                           "--batch", batch, "--steps", STEPS, *flags)
    return job.json("ref.json")["losses"]


def _run(tmp_path, cfg, nproc, *flags):
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "o"
    launch(tmp_path, cfg, "pipe_train.py", ["--out", out, "--steps", STEPS, *flags],
           nproc=nproc, timeout=240)
    return results(out, nproc)


def _assert_equal_losses(ranks, ref):
    for r in ranks:
        assert len(r["losses"]) == len(ref) == STEPS
        for got, want in zip(r["losses"], ref):
            assert abs(got - want) <= 1e-5 * abs(want), (r["rank"], r["losses"], ref)
    assert len({tuple(r["losses"]) for r in ranks}) == 1  # the same loss on every stage


def test_pipe2_1f1b_equals_single_process(job_cache, tmp_path):
    """2 stages, 1F1B, 4 micro-batches of 2 == one process on batch 8. Stage 0 holds at most 2
    micro-batches of activations (P - s), the last stage 1; shapes travel once per direction."""
    ref = _reference(job_cache, 8)
    ranks = _run(tmp_path, _cfg(2, 4), 2, "--pp", 2)
    _assert_equal_losses(ranks, ref)
    s0, s1 = ranks
    assert (s0["stage"], s1["stage"]) == (0, 1)
    assert s0["parts"] == [0, 2, 5]  # parameters method: embed+block | block, norm, head
    assert s0["schedule"] == "1f1b" and s0["global_steps"] == STEPS
    assert s0["peak_live"] == 2 and s1["peak_live"] == 1
    # (STEPS train batches + 1 eval batch) x 4 micro-batches per direction, one shape header
    assert s0["p2p"]["headers_with_shapes"] == 1 and s1["p2p"]["headers_with_shapes"] == 1
    assert s0["p2p"]["messages"] == STEPS * 4 + 4  # activations: train + eval
    assert s1["p2p"]["messages"] == STEPS * 4  # gradients: train only
    # one transport send per message, plus the one shape header: no header per message
    assert s0["p2p"]["transfers"] == s0["p2p"]["messages"] + 1
    assert s1["p2p"]["transfers"] == s1["p2p"]["messages"] + 1
    assert s0["eval_loss"] == s1["eval_loss"] and 4 < s0["eval_loss"] < 7


def test_pipe2_gpipe_tied_checkpointing_varying_shapes(job_cache, tmp_path):
    """GPipe; the embedding tied to the output head across the two stages (gradients summed
    between the owners); activation checkpointing every layer; 3 micro-batches of 2; the sequence
    length changes from step to step (16, 12, 8), so new shapes are sent when they change;
    uniform partitioning of 6 layers."""
    flags = ["--tied", "--varying-seq", "--blocks", 3]
    ref = _reference(job_cache, 6, *flags)
    cfg = _cfg(2, 3, dslaunch={"pipe_schedule": "gpipe"})
    ranks = _run(tmp_path, cfg, 2, "--pp", 2, "--ckpt-interval", 1, "--partition", "uniform",
                 *flags)
    _assert_equal_losses(ranks, ref)
    assert ranks[0]["schedule"] == "gpipe"
    assert ranks[0]["parts"] == [0, 3, 6]
    assert ranks[0]["peak_live"] == 3 and ranks[1]["peak_live"] == 3  # GPipe holds all
    # activations: 16, 12, 8 in training, then 8 again in eval -> 3 shape headers; same for
    # the gradients coming back
    assert ranks[0]["p2p"]["headers_with_shapes"] == 3
    assert ranks[1]["p2p"]["headers_with_shapes"] == 3
    # each of the 2 later layouts costs a header and one discarded buffer of the old size
    for r in ranks:
        assert r["p2p"]["transfers"] == r["p2p"]["messages"] + 1 + 2 * 2


def test_pipe2_x_dp2_four_ranks(job_cache, tmp_path):
    """pipe 2 x data 2: each data replica takes its rows, gradients averaged over the data
    group by the stage-0 strategy, loss averaged over it."""
    ref = _reference(job_cache, 8)
    ranks = _run(tmp_path, _cfg(2, 2), 4, "--pp", 2)
    _assert_equal_losses(ranks, ref)
    assert [(r["stage"], r["dp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in ranks:  # one all-reduce of the stage's gradients per step over its data group
        assert r["comm"]["all_reduce"]["calls"] == STEPS


def test_pipe2_x_tp2_four_ranks_vocab_parallel(job_cache, tmp_path):
    """pipe 2 x tensor parallel 2: Blocks split over the model group, the head's vocabulary
    split with the vocab-parallel cross-entropy on the last stage."""
    ref = _reference(job_cache, 4)
    ranks = _run(tmp_path, _cfg(2, 2), 4, "--pp", 2, "--tp", 2, "--vocab-parallel")
    _assert_equal_losses(ranks, ref)
    assert [(r["stage"], r["tp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_world_that_does_not_factor_is_a_clear_error(tmp_path):
    proc = launch(tmp_path, _cfg(2, 1), "pipe_train.py", ["--out", tmp_path / "o", "--pp", 3],
                  nproc=2, check=False)
    assert proc.returncode != 0
    assert "world size 2 does not factor into pipeline stages 3" in proc.stdout + proc.stderr


def test_checkpoint_per_stage_and_tp_rank_resume(tmp_path):
    """pipe 2 x TP 2: save after step 2 (one weights file per (stage, TP rank) + metadata),
    resume in a fresh job: step 3's loss is bit-identical to the uninterrupted run's."""
    cfg, ck = _cfg(2, 2), tmp_path / "ck"
    flags = ["--pp", 2, "--tp", 2, "--vocab-parallel"]
    full = _run(tmp_path / "a", cfg, 4, *flags, "--save-dir", ck, "--save-at", 2)
    meta = json.loads((ck / "global_step2" / "metadata.json").read_text())
    assert (meta["pipe"], meta["tp"], meta["dp"]) == (2, 2, 1)
    for s in range(2):
        for t in range(2):
            assert (ck / "global_step2" / f"layer_stage{s:02d}_tp{t:02d}_model_states.pt").is_file()
    assert (ck / "latest").read_text() == "global_step2"
    resumed = _run(tmp_path / "b", cfg, 4, *flags, "--load-dir", ck)
    for a, b in zip(full, resumed):
        assert b["start"] == 2 and b["client_state"] == {"step": 2}
        assert b["losses"] == a["losses"][2:]
