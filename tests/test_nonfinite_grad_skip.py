"""A NaN gradient skips the step the same way at stage 0, ZeRO 1, 2, 3 and in the pipeline, in
fp32 and bf16, with gradient clipping on and off (engine/base/step_policy.py).

The run: 2 gloo ranks, 3 steps of a tiny model (tests/scripts/nonfinite_grad.py), the loss NaN
on step 1 on one rank only (the gradient reduction spreads the NaN to every rank). Outcome
checked on every rank: step 1 leaves the weights bit for bit as they were, ``skipped_steps``
goes 0 -> 1, ``global_steps`` still counts the step, the lr scheduler does not move, and the steps
before and after train normally (weights change, stay finite: the NaN gradients were dropped).

Which DeepSpeed code path this matches (DeepSpeed 0.19, the mirror's HEAD):
``runtime/zero/stage_1_and_2.py: DeepSpeedZeroOptimizer.step`` -> ``check_overflow`` (inf/nan
in the gradient partitions, all-reduced) -> ``self.overflow`` -> ``zero_grad`` and return
without stepping; then ``runtime/engine.py: _take_model_step`` reads ``optimizer.overflow``:
``skipped_steps += 1``, no ``lr_scheduler.step()``, ``global_steps += 1`` regardless. DeepSpeed
takes that path under fp16 at every stage and under bf16 at ZeRO 1-2 (``bf16.check_grad_overflow``
defaults to true, engine.py ``_configure_zero_optimizer``), whether clipping is on or off (the
overflow check runs before the norm and clip). Where DeepSpeed does otherwise, dslaunch departs
on purpose, to be one behaviour: fp32 at any stage (no check: the NaN goes into the weights;
stage 0's ``clip_fp32_gradients`` multiplies by a NaN factor), bf16 at ZeRO 3 (stage3.py checks
fp16 only), bf16 at stage 0 (``FP16_Optimizer`` sets ``overflow``, counted as skipped, but steps
since bf16 does not scale), and ``BF16_Optimizer`` (``assert all_groups_norm > 0`` fails).
"""

import pytest

SCRIPT = "nonfinite_grad.py"


def _config(stage, dtype, clip):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 5e-3,
                                                        "warmup_max_lr": 1e-2,
                                                        "warmup_num_steps": 10}},
           "gradient_clipping": clip, "steps_per_print": 1000}
    if stage is not None:
        cfg["zero_optimization"] = {"stage": stage}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


RUNS = {}
for _stage in (0, 1, 2, 3, "pipe"):
    for _dtype in ("fp32", "bf16"):
        for _clip in (0.0, 1.0):
            _name = f"{_stage}-{_dtype}-clip{_clip:g}"
            _args = ["--out", "{dir}/out"] + (["--pipe"] if _stage == "pipe" else [])
            if _stage == "pipe":  # a pipeline runs at ZeRO 0 or 1: 2 stages x 1 data rank
                RUNS[_name] = (_args, _config(None, _dtype, _clip))
            else:
                RUNS[_name] = (_args, _config(_stage, _dtype, _clip))


def _records(job_cache, name):
    job_cache.run_many("nonfinite_grad", SCRIPT, {n: (tuple(a), c) for n, (a, c) in RUNS.items()},
                       nproc=2, timeout=180)
    args, cfg = RUNS[name]
    job = job_cache.run(name, SCRIPT, *args, config=cfg, nproc=2, timeout=180)
    import json

    return [json.loads((job.dir / "out" / f"rank_{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_nan_gradient_skips_the_step(job_cache, name):
    for recs in _records(job_cache, name):
        s0, s1, s2 = recs
        # step 0 trains
        assert s0["after"] != s0["before"] and s0["finite"]
        assert (s0["skipped_steps"], s0["global_steps"]) == (0, 1)
        # step 1 (NaN loss on one rank): skipped everywhere, weights untouched
        assert s1["after"] == s1["before"] and s1["finite"], name
        assert (s1["skipped_steps"], s1["global_steps"]) == (1, 2), name
        assert s1["lr"] == s0["lr"], "the lr scheduler must not step on a skipped step"
        # step 2 trains again from the same weights: the NaN gradients were dropped
        assert s2["after"] != s2["before"] and s2["finite"], name
        assert (s2["skipped_steps"], s2["global_steps"]) == (1, 3)
        assert s2["lr"] > s1["lr"]
        assert s2["grad_norm"] is None or isinstance(s2["grad_norm"], float)
