"""ZeRO stage 3 with per-module gathering, end to end: real gloo jobs through `dslaunch run`
(tests/scripts/zero3_train.py: the tiny GPT of examples/gpt.py on TextBatches), compared with
stage 0 (plain data parallel) on the same data.

Launches: the 2-rank runs of RUNS (but the peak-RSS ones) in one `dslaunch run`
(JobCache.run_many: one after the other in the same ranks), the 4-rank ones in another; each
peak-RSS run and the 16-bit save its own.

Tolerances: fp32 <= 1e-5 relative per step (the issue's bound); bf16 <= 2e-3 relative, for the
reason tests/test_zero_train.py gives (stages 1-3 keep and reduce gradients in bf16, stage 0
accumulates in fp32; one bf16 rounding is 2^-9 relative).
"""

import json

import pytest
import torch

from helpers import dslaunch, launch

SCRIPT = "zero3_train.py"
STEPS = 12
LR = 3e-3
pytestmark = pytest.mark.slow

# knobs that make per-module gathering visible on the tiny model (42,880 parameters; the biggest
# unit is the token embedding, 8,192): at most ~10k gathered elements, 5k prefetched
TIGHT = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
         "stage3_prefetch_bucket_size": 5000, "stage3_max_live_parameters": 10000}


def _config(stage, precision="fp32", **zero):
    c = {"train_batch_size": 16, "gradient_accumulation_steps": 2,
         "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.1}},
         "gradient_clipping": 0.5, "steps_per_print": 1000,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000, **zero}}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    return c


RUNS = {  # name: (ranks, config, extra script args)
    "s0": (2, _config(0), ()),
    "b0": (2, _config(0, "bf16"), ()),
    "s0_4": (4, _config(0), ()),
    "tight": (2, _config(3, **TIGHT), ()),
    # LayerNorms and biases (< 1000 elements) stay whole; DeepSpeed's default reuse distance
    "persist": (2, _config(3, stage3_param_persistence_threshold=1000,
                           stage3_prefetch_bucket_size=20000), ()),
    "offload": (2, _config(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"},
                           stage3_param_persistence_threshold=1000,
                           stage3_max_live_parameters=12000), ()),
    "tight_4": (4, _config(3, **TIGHT), ()),
    # + engine.save_16bit_model at the end without stage3_gather_16bit_weights_on_model_save
    "b3": (2, _config(3, "bf16", **TIGHT), ("--save16", "{dir}/m16")),
    "b3_off": (2, _config(3, "bf16", offload_optimizer={"device": "cpu"},
                          stage3_param_persistence_threshold=1000), ()),
    "init": (2, _config(3, **TIGHT), ("--init",)),
    "modify": (2, _config(3, **TIGHT), ("--modify", "4")),
    "init_modify": (2, _config(3, **TIGHT), ("--init", "--modify", "4")),
    "ext0": (2, _config(0), ("--external",)),
    "ext3": (2, _config(3, **TIGHT), ("--external",)),
}


def _env(name):
    # the RSS runs return freed memory to the OS (see memory.py)
    return {"DSLAUNCH_MALLOC_TUNE": "1" if name.startswith("rss") else "0"}


def _job(job_cache, name):
    nproc, config, args = RUNS[name]
    if not name.startswith("rss"):  # peak RSS needs a process of its own: the rss runs alone
        job_cache.run_many("zero3", SCRIPT, {
            n: (("--steps", STEPS, "--out", "{dir}/out.json", *a), c)
            for n, (p, c, a) in RUNS.items() if p == nproc and not n.startswith("rss")},
            nproc=nproc, env=_env(name), timeout=240)
    return job_cache.run(name, SCRIPT, "--steps", STEPS, "--out", "{dir}/out.json", *args,
                         config=config, nproc=nproc, timeout=240, env=_env(name))


def run(job_cache, name):
    """The named run's results (a fresh dict, run once per session), with its output as "log"."""
    job = _job(job_cache, name)
    return dict(job.json(), log=job.log)


def _max_rel(ref, got, steps=None):
    keys = [k for k in ref if steps is None or k in steps]
    assert keys and all(k in got for k in keys)
    return max(abs(ref[k] - got[k]) / abs(ref[k]) for k in keys)


@pytest.mark.parametrize("name,ref", [("tight", "s0"), ("persist", "s0"), ("offload", "s0"),
                                      ("tight_4", "s0_4")])
def test_fp32_per_module_gathering_trains_like_stage0(job_cache, name, ref):
    r, got = run(job_cache, ref)["losses"], run(job_cache, name)["losses"]
    assert len(got) == STEPS and r[STEPS - 1] < r[0] - 0.5  # it trains
    assert _max_rel(r, got) <= 1e-5


@pytest.mark.parametrize("name", ["b3", "b3_off"])
def test_bf16_per_module_gathering_close_to_stage0(job_cache, name):
    r, got = run(job_cache, "b0")["losses"], run(job_cache, name)["losses"]
    assert r[STEPS - 1] < r[0] - 0.5
    assert _max_rel(r, got) <= 2e-3


@pytest.mark.parametrize("name", ["tight", "tight_4", "b3"])
def test_only_a_few_modules_are_whole_at_once(job_cache, name):
    """Seen from forward hooks on every module: the parameter elements with storage at that
    moment. With max_live 10k the runtime's own count stays near it (the current unit is always
    gathered, so one unit may go past it), and far below the model."""
    res = run(job_cache, name)
    assert res["max_whole_numel"] < 0.3 * res["numel"]
    assert res["max_live"] < 0.3 * res["numel"]


def test_persistence_and_reuse_keep_more_gathered(job_cache):
    # with the defaults for reuse distance and prefetch, forward keeps units for backward
    res = run(job_cache, "persist")
    assert res["max_whole_numel"] > run(job_cache, "tight")["max_whole_numel"]


@pytest.mark.parametrize("name", ["tight", "b3", "offload"])
def test_state_bytes_are_16_over_n(job_cache, name):
    """At rest a rank holds its shards only: 16Ψ/N (mixed precision and fp32 alike; the offload
    run also keeps the fp32 master and its fp32 gradient shard on the host: 20Ψ/N), plus the
    persistent parameters whole where there are any."""
    res = run(job_cache, name)
    psi, n = res["numel"], res["world"]
    total = sum(res["memory"]["total"].values())
    expected = (20 if name == "offload" else 16) * psi / n
    if name == "offload":  # LayerNorm weights/biases and the linear biases: whole, fp32
        expected += 4 * 2 * 32 * 5 + 4 * (3 * 32 + 32 + 4 * 32 + 32) * 2
    assert abs(total - expected) <= 0.05 * expected


def test_zero_init_partitions_at_construction_and_trains_the_same(job_cache):
    res, plain = run(job_cache, "init"), run(job_cache, "tight")
    info = res["init"]
    assert info["whole_params"] == 0  # no parameter has storage after construction
    # per-rank parameter storage is 1/N of the model (fp32), up to per-parameter padding
    assert info["numel"] * 4 / 2 <= info["shard_bytes"] <= info["numel"] * 4 / 2 + 4 * 64
    # zero.Init broadcasts rank 0's construction: the same weights, hence the same losses
    assert res["losses"] == plain["losses"]
    psi, n = res["numel"], res["world"]
    assert abs(sum(res["memory"]["total"].values()) - 16 * psi / n) <= 0.05 * 16 * psi / n


@pytest.mark.parametrize("name", ["modify", "init_modify"])
def test_gathered_parameters_modification_survives_a_step(job_cache, name):
    """Step 4: rank 0 zeroes head.weight[0] inside GatheredParameters(modifier_rank=0) (rank 1
    writes 123 there, which must be dropped). Right after, the row reads 0 on every rank; after
    one optimizer step it has moved by about one Adam step (~lr), not back to its old values."""
    res = run(job_cache, name)
    mod = res["modified"]
    assert mod["right_after"] == 0.0
    assert mod["after_step"] <= 3 * LR
    assert mod["other_rows"] > 10 * LR
    ref = run(job_cache, "tight")["losses"]
    assert _max_rel(ref, res["losses"], steps=range(4)) <= 1e-5  # identical before the change
    assert res["losses"][5] != ref[5]  # and the change took effect


def test_external_parameter_is_gathered_with_the_module_that_uses_it(job_cache):
    """The head reads the token embedding's weight (tied) without owning it: registered with
    zero.register_external_parameter, stage 3 gathers it for the head too and trains like stage 0
    (the tied weight's gradient sums both uses before it is reduce-scattered)."""
    r, got = run(job_cache, "ext0")["losses"], run(job_cache, "ext3")["losses"]
    assert r[STEPS - 1] < r[0] - 0.5
    assert _max_rel(r, got) <= 1e-5


# -- peak RSS ------------------------------------------------------------------------------------

RSS_MODEL = ("--d-model", "512", "--n-layer", "4", "--steps", "2")  # 12.9M parameters
RSS_TIGHT = {"stage3_param_persistence_threshold": 1000, "stage3_max_reuse_distance": 0,
             "stage3_prefetch_bucket_size": 1000000, "stage3_max_live_parameters": 2000000}
RUNS.update({"rss0": (2, _config(0), RSS_MODEL), "rss2": (2, _config(2), RSS_MODEL),
             "rss3": (2, _config(3, **RSS_TIGHT), RSS_MODEL)})


def test_peak_rss_falls_with_the_stage(job_cache):
    """ru_maxrss per rank, all runs the same model and data. The model states a rank holds go
    from 16Ψ (stage 0) to 4Ψ + 12Ψ/N (stage 2) and 16Ψ/N (stage 3) bytes; the process around them
    (torch, gloo, activations) is the same, so the peaks must fall by a good part of those
    differences (here 77 MB and 103 MB; observed about 65 and 85 MB). A relative check in one
    test, no absolute threshold."""
    rss = {n: max(run(job_cache, n)["peak_rss_mb"]) for n in ("rss0", "rss2", "rss3")}
    psi = run(job_cache, "rss0")["numel"]
    mb = psi / 2**20
    assert rss["rss2"] < rss["rss0"] - 0.4 * (16 - 10) * mb, rss
    assert rss["rss3"] < rss["rss0"] - 0.4 * (16 - 8) * mb, rss


def test_save_16bit_model_without_gather_writes_nothing(job_cache):
    """engine.save_16bit_model under stage 3 without stage3_gather_16bit_weights_on_model_save
    writes nothing and returns False, as DeepSpeed does, and says why (the "b3" run)."""
    job = _job(job_cache, "b3")
    res = run(job_cache, "b3")
    assert res["saved16"] is False and not (job.dir / "m16" / "pytorch_model.bin").exists()
    assert "stage3_gather_16bit_weights_on_model_save" in res["log"]


def test_save_16bit_model(tmp_path):
    """engine.save_16bit_model under stage 3, bf16: with stage3_gather_16bit_weights_on_model_save
    rank 0 writes the whole model in bf16, equal to the consolidated fp32 masters rounded to bf16
    (the model's weights are exactly that after a step)."""
    cfg = _config(3, "bf16", **TIGHT, stage3_gather_16bit_weights_on_model_save=True)
    out, ck, m16 = tmp_path / "o.json", tmp_path / "ck", tmp_path / "m16"
    launch(tmp_path, cfg, SCRIPT, ["--steps", 3, "--out", out, "--save", ck, "--save16", m16],
           timeout=240)
    res = json.loads(out.read_text())
    assert res["saved16"] is True
    fp32 = tmp_path / "fp32.pt"
    c = dslaunch("ckpt", "to-fp32", ck, fp32)
    assert c.returncode == 0, c.stdout + c.stderr
    got = torch.load(m16 / "pytorch_model.bin", weights_only=True)
    ref = torch.load(fp32, weights_only=True)
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].dtype == torch.bfloat16, k
        assert torch.equal(got[k], v.to(torch.bfloat16)), k
