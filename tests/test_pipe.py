"""Pipeline parallelism end to end: real gloo jobs through `dslaunch run`, the tiny GPT as
PipelineModule layers (tests/scripts/pipe_model.py), compared with a plain single-process
PyTorch run of the same layers (same per-layer seeds, same batches, AdamW) within 1e-5 relative.

Launches: the 2-rank jobs in one `dslaunch run`, the 4-rank ones in another (JobCache.run_many:
one after the other in the same ranks; the pipe 2 x TP 2 job also saves the checkpoint the
resume test loads), the resume and the refused world each their own.
"""

import json

from helpers import launch

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
STEPS = 3


def _cfg(micro, gas, **extra):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, **extra}


def _reference(job_cache, batch, *flags):
    """The plain single-process run (pipe_train.py --reference), once per session: tests here and
    in the other pipe/TP files that ask for the same reference share it."""
    job_cache.python_many("pipe_ref", "pipe_train.py", {  # this file's three in one process
        f"pipe_ref{i}": _ref_args(*ref) for i, ref in enumerate(REFS)})
    job = job_cache.python("pipe_ref", "pipe_train.py", *_ref_args(batch, *flags))
    return job.json("ref.json")["losses"]


def _ref_args(batch, *flags):
    return ("--reference", "--out", "{dir}", "--batch", batch, "--steps", STEPS, *flags)


REFS = [(8,), (6, "--tied", "--varying-seq", "--blocks", 3), (4,)]  # (batch, *flags) used here


GPIPE_FLAGS = ("--tied", "--varying-seq", "--blocks", 3)
PP2_TP2 = ("--pp", 2, "--tp", 2, "--vocab-parallel")
JOBS = {  # name: (ranks, config, pipe_train.py flags)
    "pp2_1f1b": (2, _cfg(2, 4), ("--pp", 2)),
    "pp2_gpipe_tied_ckpt": (2, _cfg(2, 3, dslaunch={"pipe_schedule": "gpipe"}),
                            ("--pp", 2, "--ckpt-interval", 1, "--partition", "uniform",
                             *GPIPE_FLAGS)),
    "pp2_dp2": (4, _cfg(2, 2), ("--pp", 2)),
    # saves after step 2: test_checkpoint_per_stage_and_tp_rank_resume resumes it
    "pp2_tp2_vocab": (4, _cfg(2, 2), (*PP2_TP2, "--save-dir", "{dir}/ck", "--save-at", 2)),
}


def _args(flags):
    return ("--out", "{dir}/o", "--steps", STEPS, *flags)


def _job(job_cache, name):
    """The named job of JOBS, once per session; the first asked for starts every job with the
    same number of ranks in one launch (JobCache.run_many)."""
    nproc, cfg, flags = JOBS[name]
    job_cache.run_many("pipe", "pipe_train.py", {
        n: (_args(f), c) for n, (p, c, f) in JOBS.items() if p == nproc}, nproc=nproc,
        timeout=240)
    return job_cache.run(name, "pipe_train.py", *_args(flags), config=cfg, nproc=nproc,
                         timeout=240)


def _run(job_cache, name):
    """Each rank's record of the named job."""
    return _job(job_cache, name).results(sub="o")


def _assert_equal_losses(ranks, ref):
    for r in ranks:
        assert len(r["losses"]) == len(ref) == STEPS
        for got, want in zip(r["losses"], ref):
            assert abs(got - want) <= 1e-5 * abs(want), (r["rank"], r["losses"], ref)
    assert len({tuple(r["losses"]) for r in ranks}) == 1  # the same loss on every stage


def test_pipe2_1f1b_equals_single_process(job_cache):
    """2 stages, 1F1B, 4 micro-batches of 2 == one process on batch 8. Stage 0 holds at most 2
    micro-batches of activations (P - s), the last stage 1; shapes travel once per direction."""
    ref = _reference(job_cache, 8)
    ranks = _run(job_cache, "pp2_1f1b")
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


def test_pipe2_gpipe_tied_checkpointing_varying_shapes(job_cache):
    """GPipe; the embedding tied to the output head across the two stages (gradients summed
    between the owners); activation checkpointing every layer; 3 micro-batches of 2; the sequence
    length changes from step to step (16, 12, 8), so new shapes are sent when they change;
    uniform partitioning of 6 layers."""
    ref = _reference(job_cache, 6, *GPIPE_FLAGS)
    ranks = _run(job_cache, "pp2_gpipe_tied_ckpt")
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


def test_pipe2_x_dp2_four_ranks(job_cache):
    """pipe 2 x data 2: each data replica takes its rows, gradients averaged over the data
    group by the stage-0 strategy, loss averaged over it."""
    ref = _reference(job_cache, 8)
    ranks = _run(job_cache, "pp2_dp2")
    _assert_equal_losses(ranks, ref)
    assert [(r["stage"], r["dp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in ranks:  # one all-reduce of the stage's gradients per step over its data group
        assert r["comm"]["all_reduce"]["calls"] == STEPS


def test_pipe2_x_tp2_four_ranks_vocab_parallel(job_cache):
    """pipe 2 x tensor parallel 2: Blocks split over the model group, the head's vocabulary
    split with the vocab-parallel cross-entropy on the last stage."""
    ref = _reference(job_cache, 4)
    ranks = _run(job_cache, "pp2_tp2_vocab")
    _assert_equal_losses(ranks, ref)
    assert [(r["stage"], r["tp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_world_that_does_not_factor_is_a_clear_error(tmp_path):
    proc = launch(tmp_path, _cfg(2, 1), "pipe_train.py", ["--out", tmp_path / "o", "--pp", 3],
                  nproc=2, check=False)
    assert proc.returncode != 0
    assert "world size 2 does not factor into pipeline stages 3" in proc.stdout + proc.stderr


def test_checkpoint_per_stage_and_tp_rank_resume(job_cache):
    """pipe 2 x TP 2 (the job of test_pipe2_x_tp2_four_ranks_vocab_parallel): save after step 2
    (one weights file per (stage, TP rank) + metadata), resume in a fresh job: step 3's loss is
    bit-identical to the uninterrupted run's."""
    full_job = _job(job_cache, "pp2_tp2_vocab")
    full, ck = full_job.results(sub="o"), full_job.dir / "ck"
    meta = json.loads((ck / "global_step2" / "metadata.json").read_text())
    assert (meta["pipe"], meta["tp"], meta["dp"]) == (2, 2, 1)
    for s in range(2):
        for t in range(2):
            assert (ck / "global_step2" / f"layer_stage{s:02d}_tp{t:02d}_model_states.pt").is_file()
    assert (ck / "latest").read_text() == "global_step2"
    resumed = job_cache.run("pp2_tp2_vocab_resumed", "pipe_train.py",
                            *_args((*PP2_TP2, "--load-dir", ck)), config=_cfg(2, 2), nproc=4,
                            timeout=240).results(sub="o")
    for a, b in zip(full, resumed):
        assert b["start"] == 2 and b["client_state"] == {"step": 2}
        assert b["losses"] == a["losses"][2:]
