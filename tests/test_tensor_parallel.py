"""Tensor parallelism end to end: each TP layer against the full layer it was sliced from
(2-rank gloo job), and examples/gpt.py's GPT split by examples/gpt_tp.py's plan (heads and MLP
split, vocab-parallel embedding, column-parallel head) trained through
dslaunch.initialize(mpu=grid), compared with the plain single-process GPT within 1e-5 relative."""

import sys
from pathlib import Path

import pytest

from helpers import launch, results

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
from dslaunch.engine.parallel.tp_plan import apply_tp_plan
from gpt import GPT, GPTConfig
from gpt_tp import BLOCK_TP_PLAN, GPT_TP_PLAN

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
STEPS = 3


def test_layers_match_full_layers_and_rng(tmp_path):
    launch(tmp_path, {"train_batch_size": 2}, "tp_checks.py", ["--out", tmp_path / "o"])
    for r in results(tmp_path / "o"):
        for key in ("col_out", "col_dx", "col_dw", "col_db", "row_out", "row_dx", "row_dw",
                    "row_db", "emb_out", "emb_dw", "ce_loss", "ce_grad"):
            assert r[key] <= 1e-5, (key, r[key])
        assert r["col_shape"] == [6, 8]  # 12 output features split in 2
        assert r["rng_outside_same"] and r["rng_inside_differ"]
        assert r["rng_fork_advances"] and r["rng_default_untouched"]


def test_plan_only_checked_on_one_rank():
    """One rank: nothing is replaced, but a plan written for another model (a pattern matching
    nothing), a module claimed by two patterns and an unknown style are refused."""
    model = GPT(GPTConfig(seq_len=8, n_layer=2, d_model=32, n_head=2))
    kinds = [type(m) for m in model.modules()]
    assert apply_tp_plan(model, GPT_TP_PLAN, None) is model
    assert [type(m) for m in model.modules()] == kinds
    with pytest.raises(ValueError, match=r"no module of GPT matches \['attn'"):
        apply_tp_plan(model, BLOCK_TP_PLAN, None)  # a Block's plan: names without "blocks.N."
    with pytest.raises(ValueError, match="'blocks.0.mlp.fc' matches"):
        apply_tp_plan(model, {"blocks.*.mlp.fc": "column", "blocks.0.mlp.fc": "row"}, None)
    with pytest.raises(ValueError, match="unknown style 'diagonal'"):
        apply_tp_plan(model, {"head": "diagonal"}, None)


def _reference(job_cache, batch):
    """The plain single-process GPT (pipe_train.py --reference --model gpt), once per session,
    clipped at 1.0 as the engine is by default (its configs here leave gradient_clipping out):
    the TP ranks' gradient norm must be the whole model's."""
    job = job_cache.python("tp_ref", "pipe_train.py", "--reference", "--model", "gpt", "--out",
                           "{dir}", "--batch", batch, "--steps", STEPS, "--clip", 1.0)
    return job.json("ref.json")["losses"]


def _check(ranks, ref):
    for r in ranks:
        for got, want in zip(r["losses"], ref, strict=True):
            assert abs(got - want) <= 1e-5 * abs(want), (r["rank"], r["losses"], ref)


def test_tp2_gpt_equals_single_process(job_cache, tmp_path):
    """TP 2, micro 4 x accumulation 2 == one process on batch 8; no gradient all-reduce over
    the (size 1) data group: the replicated parameters get full gradients from the TP regions."""
    ref = _reference(job_cache, 8)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": ADAMW}
    launch(tmp_path, cfg, "pipe_train.py", ["--out", tmp_path / "o", "--model", "gpt", "--tp", 2,
                                            "--steps", STEPS])
    ranks = results(tmp_path / "o")
    _check(ranks, ref)
    assert [r["tp_rank"] for r in ranks] == [0, 1]
    assert "all_reduce" not in ranks[0]["comm"]


def test_tp2_x_dp2_gpt_four_ranks(job_cache, tmp_path):
    ref = _reference(job_cache, 8)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": ADAMW}
    launch(tmp_path, cfg, "pipe_train.py", ["--out", tmp_path / "o", "--model", "gpt", "--tp", 2,
                                            "--steps", STEPS], nproc=4, timeout=240)
    ranks = results(tmp_path / "o", 4)
    _check(ranks, ref)
    assert [(r["dp_rank"], r["tp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ranks[0]["comm"]["all_reduce"]["calls"] == STEPS  # over the data group, per step
