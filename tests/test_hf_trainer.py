"""The Hugging Face Trainer's DeepSpeed path on dslaunch's engine (tests/scripts/hf_trainer.py).

``TrainingArguments(deepspeed=ds.json)`` with Transformers-style ``"auto"`` configs (the Trainer
fills them from its arguments and the model's hidden_size), a tiny GPT-2 / Llama built from its
config, 2 ranks under ``dslaunch run --as-deepspeed``. The reference is the same script under
torchrun with plain DDP (no deepspeed argument): fp32, the same data and seed, so the logged
losses agree to float rounding (checked within 1e-4 relative over 5 steps with 2 accumulation
micro-steps). Jobs are cached per session (``job_cache``); three fp32 ones that start from
scratch under ``--as-deepspeed`` share one launch (``JobCache.run_many``: transformers imported
once per rank), the DDP reference (torchrun), the bf16 and the resumed job run on their own.
"""

from __future__ import annotations

import math

import pytest
import torch

safetensors = pytest.importorskip("safetensors.torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

SCRIPT = "hf_trainer.py"
AS_DS = ("--as-deepspeed",)
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
# ZeRO-2: the optimizer from the config (the engine builds it), Transformers fills its "auto"s
ZERO2 = {**AUTO, "optimizer": {"type": "AdamW", "params": {
    "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": "auto"}}
# ZeRO-3: no optimizer section, so the Trainer passes its own torch AdamW to initialize
ZERO3 = {**AUTO, "zero_optimization": {
    "stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_gather_16bit_weights_on_model_save": True}}
# ZeRO-3 with the optimizer and the parameters offloaded to the CPU
ZERO3_OFFLOAD = {**ZERO3, "zero_optimization": {**ZERO3["zero_optimization"],
                                                "offload_optimizer": {"device": "cpu"},
                                                "offload_param": {"device": "cpu"}}}
HIDDEN = 32  # the script's models
# name: (args, config), in the order they run in their one launch. Not the bf16 one: after an
# fp32 run in the same process its first losses came out 1e-3 off DDP's (state Accelerate keeps
# per process), 10x what it gives on its own
DS_RUNS = {
    "hf-z2": (("--out", "{dir}", "--save-steps", 3), ZERO2),
    "hf-z3": (("--out", "{dir}", "--save-model", "--eval"), ZERO3),
    "hf-z3-init": (("--out", "{dir}", "--model", "llama", "--zero-init", "--save-model"), ZERO3),
}


def _ds(job_cache, name):
    job_cache.run_many("hf-ds", SCRIPT, DS_RUNS, config_flag="--deepspeed", flags=AS_DS)
    args, config = DS_RUNS[name]
    return job_cache.run(name, SCRIPT, *args, config=config, config_flag="--deepspeed",
                         flags=AS_DS)


def _ddp(job_cache):
    return job_cache.torchrun("hf-ddp", SCRIPT, "--out", "{dir}", "--save-model", "--eval")


def _zero2(job_cache):
    return _ds(job_cache, "hf-z2")


def _zero3(job_cache):
    return _ds(job_cache, "hf-z3")


def _close(ours: dict, ref: dict, rel: float = 1e-4) -> None:
    assert sorted(ours) == sorted(ref) == [1, 2, 3, 4, 5]
    for step in ref:
        assert math.isclose(ours[step], ref[step], rel_tol=rel), (step, ours, ref)


def _on_our_engine(res: dict, stage: int) -> None:
    assert res["deepspeed"] and res["engine_module"].startswith("dslaunch."), res
    eng = res["engine"]
    assert (eng["micro"], eng["gas"], eng["train_batch"], eng["stage"]) == (2, 2, 8, stage)


def test_zero2_auto_config_trains_as_ddp(job_cache):
    ref, res = _ddp(job_cache).json("result.json"), _zero2(job_cache).json("result.json")
    assert ref["engine_module"] == "torch.nn.parallel.distributed" and not ref["deepspeed"]
    _on_our_engine(res, 2)
    # "auto" filled by the Trainer from its arguments (lr 3e-3, weight_decay 0.01, hidden 32)
    assert res["engine"]["filled_optimizer"]["params"] == {
        "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
    assert res["engine"]["filled_zero"]["reduce_bucket_size"] == HIDDEN * HIDDEN
    _close(res["losses"], ref["losses"])


def test_zero3_auto_config_trains_as_ddp(job_cache):
    ref, res = _ddp(job_cache).json("result.json"), _zero3(job_cache).json("result.json")
    _on_our_engine(res, 3)
    zero = res["engine"]["filled_zero"]
    assert zero["stage3_param_persistence_threshold"] == 10 * HIDDEN
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * HIDDEN * HIDDEN)
    assert res["engine"]["optimizer"] == "torch.optim.adamw.AdamW"  # the Trainer's, passed in
    _close(res["losses"], ref["losses"])
    # trainer.evaluate() after training runs the engine's forward (gathered, no optimizer)
    assert len(res["eval_losses"]) == 1
    assert math.isclose(res["eval_losses"][0], ref["eval_losses"][0], rel_tol=1e-4)


def test_checkpoint_resumes_where_it_stopped(job_cache):
    """save_strategy="steps" writes our engine's checkpoint (global_step3/) beside the Trainer's
    files; resume_from_checkpoint loads it and steps 4-5 repeat the uninterrupted run's."""
    full = _zero2(job_cache)
    ckpt = full.dir / "trainer" / "checkpoint-3"
    assert (ckpt / "global_step3" / "model_states.pt").is_file()
    assert (ckpt / "latest").read_text().strip() == "global_step3"
    resumed = job_cache.run("hf-z2-resume", SCRIPT, "--out", "{dir}", "--resume", ckpt,
                            config=ZERO2, config_flag="--deepspeed", flags=AS_DS)
    ref, res = full.json("result.json")["losses"], resumed.json("result.json")["losses"]
    for step in (4, 5):
        assert math.isclose(res[step], ref[step], rel_tol=1e-6), (step, res, ref)


def test_zero3_save_model_writes_full_weights(job_cache):
    z3, ddp = _zero3(job_cache), _ddp(job_cache)
    saved = safetensors.load_file(str(z3.dir / "model" / "model.safetensors"))
    gathered = torch.load(z3.dir / "gathered.pt", weights_only=True)
    # every parameter, whole (GPT-2 ties lm_head to wte: saved once), as the engine holds it
    assert set(saved) == set(gathered) and len(saved) == 28
    for name, tensor in saved.items():
        assert torch.equal(tensor, gathered[name]), name
    assert saved["transformer.wte.weight"].shape == (96, HIDDEN)
    # and what DDP trained: the same weights to float rounding
    reference = safetensors.load_file(str(ddp.dir / "model" / "model.safetensors"))
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-4, atol=1e-5)


def test_zero3_init_builds_the_model_partitioned(job_cache):
    """TrainingArguments before the model: Transformers builds it under deepspeed.zero.Init (ours)
    with its RoPE guard patching partition_parameters' globals; a Llama trains and saves whole."""
    job = _ds(job_cache, "hf-z3-init")
    res = job.json("result.json")
    _on_our_engine(res, 3)
    assert res["built_partitioned"]
    assert all(math.isfinite(v) for v in res["losses"].values()) and len(res["losses"]) == 5
    saved = safetensors.load_file(str(job.dir / "model" / "model.safetensors"))
    gathered = torch.load(job.dir / "gathered.pt", weights_only=True)
    assert set(saved) == set(gathered)
    for name, tensor in saved.items():
        assert torch.equal(tensor, gathered[name]), name
    assert saved["model.embed_tokens.weight"].shape == (96, HIDDEN)


def test_zero3_cpu_offload_bf16(job_cache):
    """bf16 from the Trainer's argument ("auto"), optimizer and parameters offloaded to the CPU:
    the engine holds bf16 parameters and steps with its CPU Adam; bf16 rounding keeps the losses
    near fp32 DDP's (measured within 1e-4 relative; 1e-3 asserted)."""
    res = job_cache.run("hf-z3-offload-bf16", SCRIPT, "--out", "{dir}", "--bf16",
                        config=ZERO3_OFFLOAD, config_flag="--deepspeed",
                        flags=AS_DS).json("result.json")
    _on_our_engine(res, 3)
    assert res["engine"]["param_dtype"] == "torch.bfloat16"
    assert res["engine"]["optimizer"] == "dslaunch.engine.optim.cpu_adam.DSCPUAdam"
    _close(res["losses"], _ddp(job_cache).json("result.json")["losses"], rel=1e-3)
