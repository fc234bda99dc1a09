"""Pipeline / tensor parallel with the engine's other features, end to end through `dslaunch run`
on real gloo jobs, against a plain single-process PyTorch run of the same layers (same per-layer
seeds, same batches, AdamW; tests/scripts/pipe_train.py --reference):

- gradient clipping: the global norm over pipe stages, TP ranks and data ranks, TP-replicated and
  tied parameters counted once, equal to torch.nn.utils.clip_grad_norm_'s (clip 0.05 while the
  norm is ~1: every step is clipped);
- ZeRO stage 1 with the pipeline (tied weights, 4 ranks) and with TP x DP; stages 2/3 with the
  pipeline are refused;
- bf16 and fp16 (dynamic loss scale) in the pipeline; an fp16 overflow skips the step on every
  stage alike;
- `dslaunch ckpt to-fp32` of a pipe x TP checkpoint (TP slices merged, tied weights once, fp32
  masters in bf16) loaded into the unpartitioned PipelineModule: the job's eval loss within 1e-6;
- train_batch() without a data iterator walks ``training_data`` (in this process).

Launches: the three 4-rank jobs in one `dslaunch run`, the three 2-rank ones in another
(JobCache.run_many: one after the other in the same ranks), the refused one on its own; the
single-process references once per session (shared with the other pipe/TP files).
"""

import json
import subprocess
import sys

from helpers import ROOT, SCRIPTS, dslaunch, launch

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
STEPS = 3
CLIP = 0.05


def _cfg(micro, gas, **extra):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, **extra}


def _reference(job_cache, batch, *flags):
    """The plain single-process run (pipe_train.py --reference), once per session: tests here and
    in the other pipe/TP files that ask for the same reference share it."""
    job_cache.python_many("pipe_ref", "pipe_train.py", {  # this file's six in one process
        f"pipe_ref{i}": _ref_args(*ref) for i, ref in enumerate(REFS)})
    job = job_cache.python("pipe_ref", "pipe_train.py", *_ref_args(batch, *flags))
    return job.json("ref.json")


def _ref_args(batch, *flags):
    return ("--reference", "--out", "{dir}", "--batch", batch, "--steps", STEPS, *flags)


REFS = [(4, "--clip", CLIP, "--tied"), (8, "--clip", CLIP, "--tied"),  # (batch, *flags) used here
        (8, "--model", "gpt", "--clip", CLIP), (8, "--dtype", "bf16"), (8,), (8, "--clip", CLIP)]


JOBS = {  # name: (ranks, config, pipe_train.py flags); "{dir}/ck": the checkpoint of the last step
    "pp2_tp2_tied_clip": (4, _cfg(2, 2, gradient_clipping=CLIP),
                          ("--pp", 2, "--tp", 2, "--tied", "--save-dir", "{dir}/ck",
                           "--save-at", STEPS)),
    "pp2_dp2_zero1_tied_clip": (4, _cfg(2, 2, gradient_clipping=CLIP,
                                        zero_optimization={"stage": 1}), ("--pp", 2, "--tied")),
    "tp2_dp2_zero1_clip": (4, _cfg(2, 2, gradient_clipping=CLIP, zero_optimization={"stage": 1}),
                           ("--model", "gpt", "--tp", 2)),
    "pp2_bf16": (2, _cfg(2, 4, bf16={"enabled": True}),
                 ("--pp", 2, "--save-dir", "{dir}/ck", "--save-at", STEPS)),
    "pp2_fp16_clip": (2, _cfg(2, 4, gradient_clipping=CLIP, fp16={"enabled": True}), ("--pp", 2)),
    # started at a loss scale of 2^40: every step overflows
    "pp2_fp16_overflow": (2, _cfg(2, 4, fp16={"enabled": True, "initial_scale_power": 40,
                                              "hysteresis": 1}), ("--pp", 2)),
}


def _args(flags):
    return ("--out", "{dir}/o", "--steps", STEPS, *flags)


def _job(job_cache, name):
    """The named job of JOBS, once per session; the first asked for starts every job with the
    same number of ranks in one launch (JobCache.run_many)."""
    nproc, cfg, flags = JOBS[name]
    job_cache.run_many("pipe_features", "pipe_train.py", {
        n: (_args(f), c) for n, (p, c, f) in JOBS.items() if p == nproc}, nproc=nproc,
        timeout=300)
    return job_cache.run(name, "pipe_train.py", *_args(flags), config=cfg, nproc=nproc,
                         timeout=300)


def _run(job_cache, name):
    """Each rank's record of the named job."""
    return _job(job_cache, name).results(sub="o")


def _close(got, want, rel):
    assert len(got) == len(want) == STEPS, (got, want)
    for g, w in zip(got, want):
        assert abs(g - w) <= rel * abs(w), (got, want, rel)


def _consolidated_loss(tmp_path, job, *flags):
    """``dslaunch ckpt to-fp32`` of the job's checkpoint, loaded into one plain process."""
    out = tmp_path / "fp32.pt"
    proc = dslaunch("ckpt", "to-fp32", job.dir / "ck", out)
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([sys.executable, str(SCRIPTS / "pipe_consolidated.py"), "--file",
                            str(out), "--ranks", str(job.dir / "o"), *map(str, flags)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    return proc.stdout, json.loads(check.stdout)


def test_pipe2_x_tp2_clip_tied_then_to_fp32(job_cache, tmp_path):
    """pipe 2 x TP 2 with the embedding tied to the head across the stages and every step
    clipped: losses and the global norm equal the single process's; the checkpoint of the last
    step, consolidated, gives the job's eval loss in one plain process."""
    flags = ["--tied"]
    ref = _reference(job_cache, 4, "--clip", CLIP, *flags)
    assert min(ref["norms"]) > 10 * CLIP  # clipping bites
    ranks = _run(job_cache, "pp2_tp2_tied_clip")
    for r in ranks:
        _close(r["losses"], ref["losses"], 1e-5)
        _close(r["norms"], ref["norms"], 1e-5)
    msg, got = _consolidated_loss(tmp_path, _job(job_cache, "pp2_tp2_tied_clip"), *flags)
    assert "12 merged from tensor-parallel slices" in msg  # qkv/fc/proj weights + col biases
    assert "tied copies written once" in msg
    assert got["missing"] == [] and got["dp_ranks"] == [0]
    assert "tied_modules.embed.tok_emb.weight" in got["keys"] and "1.block.attn.qkv.weight" in \
        got["keys"]
    want = ranks[0]["eval_loss"]
    assert abs(got["loss"] - want) <= 1e-6 * abs(want), (got["loss"], want)


def test_pipe2_x_dp2_zero1_tied_clip(job_cache):
    """ZeRO stage 1 over each stage's data group (pipe 2 x data 2), tied weights summed before
    the boundary reduce-scatter, clipped with the global norm of the shards."""
    ref = _reference(job_cache, 8, "--clip", CLIP, "--tied")
    ranks = _run(job_cache, "pp2_dp2_zero1_tied_clip")
    for r in ranks:
        _close(r["losses"], ref["losses"], 1e-5)
        _close(r["norms"], ref["norms"], 1e-5)
        assert r["comm"]["reduce_scatter"]["calls"] == STEPS  # ZeRO 1: once per step


def test_tp2_x_dp2_zero1_clip(job_cache):
    """examples/gpt.py's GPT with TP 2 (vocab-parallel embedding and head) x data 2, ZeRO 1,
    clipped: the vocab-split weights count on every TP rank, the replicated ones once."""
    ref = _reference(job_cache, 8, "--model", "gpt", "--clip", CLIP)
    ranks = _run(job_cache, "tp2_dp2_zero1_clip")
    for r in ranks:
        _close(r["losses"], ref["losses"], 1e-5)
        _close(r["norms"], ref["norms"], 1e-5)


def test_pipe2_bf16_then_to_fp32_masters(job_cache, tmp_path):
    """bf16 weights, fp32 masters, 4 micro-batches on 2 stages against a single process doing
    the same (bf16 weights, fp32 masters, one backward over the whole batch): equal within 5e-4
    relative. Not 1e-5: the pipeline rounds each micro-batch's gradient to bf16 and sums in fp32,
    the single process rounds the whole batch's gradient once; bf16 keeps 8 bits (relative step
    3.9e-3), and the differing rounding moves Adam's updates slightly (measured ~7e-5). The
    consolidated file holds the fp32 masters (not bf16 values): rounded to bf16 they give the
    job's eval loss within 1e-6."""
    ref = _reference(job_cache, 8, "--dtype", "bf16")
    ref32 = _reference(job_cache, 8)
    ranks = _run(job_cache, "pp2_bf16")
    for r in ranks:
        assert r["dtype"] == "bf16"
        assert r["losses"][0] == ref["losses"][0]  # same weights, same bf16 forward
        _close(r["losses"], ref["losses"], 5e-4)
        _close(r["losses"], ref32["losses"], 5e-4)
    _, got = _consolidated_loss(tmp_path, _job(job_cache, "pp2_bf16"), "--dtype", "bf16")
    assert got["all_bf16_representable"] is False  # the masters, not the bf16 weights
    want = ranks[0]["eval_loss"]
    assert abs(got["loss"] - want) <= 1e-6 * abs(want), (got["loss"], want)


def test_pipe2_fp16_clip_and_overflow_skips_on_every_stage(job_cache):
    """fp16 with the dynamic loss scale and clipping equals the fp32 single process within
    1e-4 (fp16 keeps 11 bits; the gradients are unscaled and clipped in fp32). Started at a
    scale of 2^40 every step overflows: every stage skips it (same skipped count, same scale)
    and no weight moves (the last step's loss equals the eval loss on the same batch)."""
    ref = _reference(job_cache, 8, "--clip", CLIP)
    ranks = _run(job_cache, "pp2_fp16_clip")
    for r in ranks:
        assert r["skipped_steps"] == 0
        _close(r["losses"], ref["losses"], 1e-4)
        _close(r["norms"], ref["norms"], 1e-3)
    ranks = _run(job_cache, "pp2_fp16_overflow")
    assert [(r["skipped_steps"], r["loss_scale"]) for r in ranks] == [(3, 2.0 ** 37)] * 2
    for r in ranks:
        assert r["losses"][-1] == r["eval_loss"]


def test_pipe_with_zero2_is_refused(tmp_path):
    proc = launch(tmp_path, _cfg(2, 2, zero_optimization={"stage": 2}), "pipe_train.py",
                  ["--out", tmp_path / "o", "--pp", 2, "--steps", 1], nproc=2, check=False)
    assert proc.returncode != 0
    assert "zero_optimization.stage: 2 cannot be combined with pipeline parallelism" in \
        proc.stdout + proc.stderr


def test_train_batch_without_data_iter_walks_the_training_data():
    """``train_batch()`` with ``training_data=`` at initialize (DeepSpeedExamples' pipeline
    script): one pass over the data after another, not the loader's first batch every time; a
    ``data_iter`` given once is kept for later calls; ``eval_batch``'s is not. In this process:
    one stage, world size 1."""
    import torch

    import dslaunch
    from dslaunch.pipe import PipelineModule

    seen = []
    lin = torch.nn.Linear(1, 1)
    lin.register_forward_pre_hook(lambda m, a: seen.append(sorted(a[0].flatten().tolist())))
    net = PipelineModule(layers=[lin], loss_fn=lambda o, y: ((o - y) ** 2).mean(), num_stages=1)
    data = torch.utils.data.TensorDataset(torch.arange(8.).view(8, 1), torch.zeros(8, 1))
    engine, *_ = dslaunch.initialize(model=net, training_data=data, config={
        "train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})
    for _ in range(5):
        engine.train_batch()
    assert sorted(x for batch in seen[:4] for x in batch) == list(range(8))
    assert seen[4] == seen[0]  # the second pass, in the sampler's (fixed) order
    mine = iter([(torch.full((2, 1), 100.), torch.zeros(2, 1))] * 3)
    engine.train_batch(data_iter=mine)
    engine.eval_batch(iter([(torch.full((2, 1), -1.), torch.zeros(2, 1))]))
    engine.train_batch()
    assert seen[-3:] == [[100., 100.], [-1., -1.], [100., 100.]]
