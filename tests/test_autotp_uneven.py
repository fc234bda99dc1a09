"""AutoTP when the size does not divide the model (engine/parallel/autotp_shards.py: DeepSpeed 0.19.8's
cut): a tiny Llama with 6 query heads on 3 key/value heads and an MLP 99 wide, and a GPT-2 with 3
heads in its fused ``c_attn`` and a 99-wide MLP, trained 10 steps at TP 2 (2 ranks) at ZeRO 0, 1
and 2 against the same model unsplit in one process: losses within 1e-5 relative. Rank 0 holds
2 of the 3 key/value heads (4 of the 6 query heads) and 50 MLP features, rank 1 the rest (elements
and bytes checked); ``save_16bit_model`` writes the whole model; the TP 2 checkpoints resume at
TP 1 (ZeRO 1, 2) and TP 3 (ZeRO 1, an even cut) with the next losses equal to the reference's.
An untied LM head of 97 rows is cut 49 + 48 (logits gathered or left split). Layer specs cut the
same way (DeepSpeed's spec layers and their stacked parts use the same rule): the Llama under
preset_model "llama", and a Phi-3 whose fused gate_up_proj of two 99-feature parts a spec's
shape [2, -1] cuts 50 + 49 each."""

import pytest

from helpers import results

STEPS = 10
HIDDEN = 48


@pytest.fixture(scope="module")
def uneven(job_cache):
    run = job_cache.run("autotp_uneven", "autotp_train.py", "--out", "{dir}/o", "--tp", 2,
                        "--steps", STEPS, "--models", "llama_uneven,gpt2_uneven",
                        "--save-each", "{dir}/ckpts", "--uneven-head", "--uneven-specs", nproc=2,
                        timeout=240)
    assert run.ok, run.log[-4000:]
    return run


# split weight -> elements rank 0, rank 1 hold (DeepSpeed's cut of 3 heads of 8 and 99 features)
LLAMA = {"self_attn.q_proj.weight": (32 * HIDDEN, 16 * HIDDEN),
         "self_attn.k_proj.weight": (16 * HIDDEN, 8 * HIDDEN),
         "self_attn.o_proj.weight": (HIDDEN * 32, HIDDEN * 16),
         "mlp.gate_proj.weight": (50 * HIDDEN, 49 * HIDDEN),
         "mlp.down_proj.weight": (HIDDEN * 50, HIDDEN * 49)}
GPT2 = {"attn.c_attn.weight": (3 * 32 * HIDDEN, 3 * 16 * HIDDEN), "attn.c_attn.bias": (96, 48),
        "attn.c_proj.weight": (HIDDEN * 32, HIDDEN * 16), "mlp.c_fc.weight": (50 * HIDDEN, 49 * HIDDEN),
        "mlp.c_proj.weight": (HIDDEN * 50, HIDDEN * 49)}


@pytest.mark.parametrize("model", ["llama_uneven", "gpt2_uneven"])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_uneven_cut_trains_like_the_whole_model(uneven, model, stage):
    ranks = results(uneven.dir / "o", 2)
    layer = "model.layers.1." if model.startswith("llama") else "transformer.h.1."
    expected = LLAMA if model.startswith("llama") else GPT2
    for r in ranks:
        run = r[f"{model}_z{stage}"]
        assert len(run["losses"]) == STEPS
        for got, want in zip(run["losses"], run["ref"], strict=True):
            assert abs(got - want) <= 1e-5 * abs(want), (model, stage, run["losses"], run["ref"])
        sizes = run["split"]["sizes"]
        for name, per_rank in expected.items():
            local, full, elem = sizes[layer + name]
            assert local == per_rank[r["tp_rank"]] and sum(per_rank) == full, (name, local)
        assert run["split"]["param_bytes"] < run["split"]["full_bytes"]
    for name in sizes:  # every split weight: the two ranks' slices make the whole
        assert sum(r[f"{model}_z{stage}"]["split"]["sizes"][name][0] for r in ranks) == sizes[name][1]


PHI3 = {"mlp.gate_up_proj.weight": ((50 + 50) * HIDDEN, (49 + 49) * HIDDEN),
        "mlp.down_proj.weight": (HIDDEN * 50, HIDDEN * 49)}


@pytest.mark.parametrize("run,expected", [("llama_uneven_preset_z1", LLAMA),
                                          ("phi3_uneven_specs_z2", PHI3)])
def test_layer_specs_cut_unevenly_too(uneven, run, expected):
    ranks = results(uneven.dir / "o", 2)
    for r in ranks:
        got = r["uneven_specs"][run]
        assert len(got["losses"]) == STEPS
        for loss, want in zip(got["losses"], got["ref"], strict=True):
            assert abs(loss - want) <= 1e-5 * abs(want), (run, got["losses"], got["ref"])
        sizes = got["split"]["sizes"]
        for name, per_rank in expected.items():
            local, full, _ = sizes["model.layers.1." + name]
            assert local == per_rank[r["tp_rank"]] and sum(per_rank) == full, (name, local)
    if run.startswith("phi3"):  # the attention stays whole (its spec says skip)
        assert "model.layers.1.self_attn.qkv_proj.weight" in got["split"]["kept"]


def test_lm_head_of_an_uneven_vocabulary(uneven):
    """An untied LM head of 97 rows over 2 ranks: 49 + 48 rows (DeepSpeed's near-even cut), the
    logits gathered (default) or left split (vocab_parallel_lm_head): loss, logits and gradients
    equal the whole model's, one forward and backward."""
    for r in results(uneven.dir / "o", 2):
        for label, got in r["uneven_head"].items():
            assert got["head_rows"] == (49, 48)[r["tp_rank"]], label
            assert got["loss"] <= 1e-6 and got["logits"] <= 1e-5, (label, got)
            assert got["head_grad"] <= 1e-6 and got["emb_grad"] <= 1e-6, (label, got)


@pytest.mark.parametrize("stage,tp", [(1, 1), (2, 1), (1, 3)])
def test_uneven_checkpoint_resumes_at_another_size(job_cache, uneven, stage, tp):
    args = ("autotp_resume.py", "--ckpt", uneven.dir / "ckpts", "--tag", f"z{stage}_uneven",
            "--stage", stage, "--out", "{dir}/o", "--tp", tp, "--start", STEPS, "--more", 4,
            "--model", "llama_uneven")
    name = f"autotp_uneven_resume_z{stage}_tp{tp}"
    job = job_cache.python(name, *args) if tp == 1 else job_cache.run(name, *args, nproc=tp,
                                                                     timeout=240)
    assert job.ok, job.log[-4000:]
    for r in results(job.dir / "o", tp):
        assert r["resumed_at"] == STEPS
        for got, want in zip(r["losses"], r["ref"], strict=True):
            assert abs(got - want) <= 1e-5 * abs(want), (stage, tp, r["losses"], r["ref"])


def test_deepspeeds_cut():
    from dslaunch.engine.parallel.autotp_shards import ShardRule

    rule = ShardRule(kv=3)
    assert rule.sizes("model.layers.0.self_attn.q_proj", 48, 2) == [32, 16]  # 6 heads of 8
    assert rule.sizes("model.layers.0.self_attn.k_proj", 24, 2) == [16, 8]
    assert rule.sizes("model.layers.0.mlp.gate_proj", 99, 2) == [50, 49]
    assert rule.span("model.layers.0.self_attn.o_proj", 48, 2, 1) == (32, 48)
    assert ShardRule(kv=8).sizes("x.self_attn.q_proj", 4096, 3) == [1536, 1536, 1024]
    assert ShardRule(kv=None, grain=64).sizes("x.mlp.up_proj", 1344, 2) == [704, 640]
    assert ShardRule(kv=4).sizes("x.self_attn.q_proj", 64, 2) == [32, 32]  # even: plain blocks
