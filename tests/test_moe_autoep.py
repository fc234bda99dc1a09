"""AutoEP (dslaunch/engine/parallel/moe/auto_ep.py) on tiny Mixtral-, Qwen2-MoE- and DeepSeek-V3-style
transformers models built from configs: one 2-rank launch (tests/scripts/moe_autoep_ranks.py)
trains each model 3 SGD steps as it is, with AutoEP at autoep_size 1 and at 2: the same losses
(1e-6 relative; measured equal to the printed digits) and the same final expert weights (1e-5).
tests/scripts/moe_autoep_engine.py runs in the same launch, beside the other MoE test files'
2-rank jobs (tests/moe_jobs.py)."""

from __future__ import annotations

import pytest
from moe_jobs import two_rank_job

pytest.importorskip("transformers")


def test_presets_are_the_configs_choices():
    from dslaunch.config.schema import EXPERT_PARALLEL
    from dslaunch.engine.parallel.moe.auto_ep import PRESETS

    assert set(EXPERT_PARALLEL.fields["preset_model"].choices) == {None, *PRESETS}


def test_autoep_same_losses_at_sizes_1_and_2(job_cache):
    for res in two_rank_job(job_cache, "autoep_ranks").results(sub="o"):
        for name, blocks in (("mixtral", 2), ("qwen2_moe", 2), ("deepseek_v3", 1)):
            ref = res[f"{name}_ref"]
            assert ref[-1] < ref[0]  # it trains
            for size in (1, 2):
                assert res[f"{name}_replaced_{size}"] == blocks
                assert res[f"{name}_ep{size}"] == pytest.approx(ref, rel=1e-6), (name, size)
                assert res[f"{name}_ep{size}_experts"] <= 1e-5, (name, size)


def test_autoep_through_initialize(job_cache):
    """The config's ``expert_parallel`` section through ``dslaunch.initialize``: the same 3 losses
    at autoep_size 1 and 2 as the model trained as it is (2 ranks, SGD, fp32). Needs the engine
    to reduce expert gradients over their expert-data-parallel group (branch moe-engine); until
    that is merged, features.py refuses the section and this test is skipped."""
    from dslaunch.config.features import NOT_SUPPORTED_YET

    if any(f.path == "expert_parallel.enabled" for f in NOT_SUPPORTED_YET):
        pytest.skip("expert_parallel is refused until the engine reduces expert gradients")
    for res in two_rank_job(job_cache, "autoep_engine").results(sub="o"):
        ref, _ = res["ref"]
        for size in (1, 2):
            losses, experts = res[f"ep{size}"]
            assert losses == pytest.approx(ref, rel=1e-6), size
            assert experts == 4  # 2 blocks x (gate_up_proj, down_proj), marked as experts
