"""The Hugging Face Trainer resumes a ZeRO-3 checkpoint of dslaunch's engine, whose
``model_states.pt`` holds no weights (placeholders; the weights are in the rank files' shards,
``engine/checkpoint/zero3_module.py``), on the tiny GPT-2 of tests/scripts/hf_trainer.py, whose
``lm_head`` is tied to ``wte`` (two state_dict keys, one shard).

``save_steps=3`` writes ``checkpoint-3/global_step3/`` beside the Trainer's files;
``resume_from_checkpoint`` loads it (Transformers calls ``engine.load_checkpoint``) and steps 4-5
repeat the uninterrupted run's losses within 1e-6 relative (the ZeRO-2 resume's bound in
tests/test_hf_trainer.py: the same arithmetic, only the data loader restarted).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

SCRIPT = "hf_trainer.py"
AS_DS = ("--as-deepspeed",)
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
ZERO3 = {**AUTO, "zero_optimization": {
    "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": 0}}


def test_trainer_resumes_a_weightless_zero3_checkpoint(job_cache):
    full = job_cache.run("hf-z3-save", SCRIPT, "--out", "{dir}", "--save-steps", 3,
                         config=ZERO3, config_flag="--deepspeed", flags=AS_DS, timeout=400)
    ckpt = full.dir / "trainer" / "checkpoint-3"
    states = torch.load(ckpt / "global_step3" / "model_states.pt", weights_only=True)
    part = states["zero3_partitioned"]
    assert part and all(states["module"][k].numel() == 0 for k in part)
    assert part["lm_head.weight"][0] == "transformer.wte.weight"  # tied: one shard
    resumed = job_cache.run("hf-z3-resume", SCRIPT, "--out", "{dir}", "--resume", ckpt,
                            config=ZERO3, config_flag="--deepspeed", flags=AS_DS, timeout=400)
    ref, res = full.json("result.json")["losses"], resumed.json("result.json")["losses"]
    for step in (4, 5):
        assert math.isclose(res[step], ref[step], rel_tol=1e-6), (step, res, ref)
