"""Data-parallel engine (ZeRO stage 0), end to end: real 2-rank gloo jobs started by `dslaunch run`
against a plain single-process PyTorch reference on the same global batches. The four jobs run in
one launch (JobCache.run_many: one after the other in the same ranks)."""

from pathlib import Path

import pytest
import torch

from helpers import results, run_python

STEPS = 4
N_PARAMS, N_TENSORS = 29664, 17  # the tiny GPT of scripts/engine_train.py
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    run_python("train_ref.py", ["--out", out, "--steps", STEPS, "--batch", 8, "--clip", 0.5])
    import json
    return json.loads((out / "ref.json").read_text())["losses"], \
        torch.load(out / "ref_final.pt", weights_only=True)


def _check_against_reference(out, reference):
    ref_losses, ref_state = reference
    ranks = results(out)
    for r in ranks:
        assert len(r["losses"]) == STEPS
        for got, want in zip(r["losses"], ref_losses):
            assert abs(got - want) <= 1e-5 * abs(want), (r["losses"], ref_losses)
    # replicas hold identical weights, equal to the reference's: Adam's g/(sqrt(v)+eps) turns
    # last-bit differences of near-zero gradients (sum order of the all-reduce) into visible
    # update differences, so weights are compared to 2% of one lr step (1e-3)
    s0 = torch.load(Path(out) / "rank_0_final.pt", weights_only=True)
    s1 = torch.load(Path(out) / "rank_1_final.pt", weights_only=True)
    for name, want in ref_state.items():
        assert torch.equal(s0[name], s1[name]), name
        torch.testing.assert_close(s0[name], want, rtol=1e-4, atol=2e-5, msg=name)
    return ranks


JOBS = {  # name: (config, engine_train.py args); all four in one launch (see _out)
    "sync": ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": ADAMW, "gradient_clipping": 0.5,
              "zero_optimization": {"stage": 0, "overlap_comm": False}}, ("--steps", STEPS)),
    "accum_overlap": ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                       "optimizer": ADAMW, "gradient_clipping": 0.5,
                       "zero_optimization": {"stage": 0, "reduce_bucket_size": 4096,
                                             "overlap_comm": True}}, ("--steps", STEPS)),
    "fp16_overflow": ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                       "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                       "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1,
                                "loss_scale_window": 2}}, ("--steps", 6, "--inject-inf", 1)),
    "bf16": ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "bf16": {"enabled": True}},
             ("--steps", 12)),
}


def _out(job_cache, name) -> Path:
    """The rank records' directory of the named 2-rank job; the first asked for starts the four
    in one launch (JobCache.run_many: one after the other in the same ranks)."""
    runs = {n: (("--out", "{dir}/o", *a), c) for n, (c, a) in JOBS.items()}
    job_cache.run_many("engine_dp", "engine_train.py", runs)
    return job_cache.run(name, "engine_train.py", *runs[name][0], config=runs[name][1]).dir / "o"


def test_two_ranks_equal_single_process(job_cache, reference):
    """micro 4 x 2 ranks == one process on batch 8 (fp32, clipping on, synchronous buckets)."""
    ranks = _check_against_reference(_out(job_cache, "sync"), reference)
    # one all-reduce of the whole fp32 gradient per step (the default bucket holds it all)
    stats = ranks[0]["comm"]["all_reduce"]
    assert stats["calls"] == STEPS
    assert stats["bytes"] == STEPS * 4 * N_PARAMS
    assert ranks[0]["global_samples"] == STEPS * 8 and ranks[0]["global_steps"] == STEPS


def test_grad_accumulation_small_buckets_overlap(job_cache, reference):
    """micro 2 x accum 2 x 2 ranks == one process on batch 8; 4096-element buckets reduced
    asynchronously from backward hooks, once per boundary (not per micro-step)."""
    ranks = _check_against_reference(_out(job_cache, "accum_overlap"), reference)
    r = ranks[0]
    assert r["micro_steps"] == 2 * STEPS and r["global_steps"] == STEPS
    stats = r["comm"]["all_reduce"]
    assert stats["bytes"] == STEPS * 4 * N_PARAMS  # bytes once per boundary
    assert stats["calls"] > STEPS and stats["calls"] % STEPS == 0  # several buckets per step
    # memory: fp32 params + fp32 grad buffer + AdamW (exp_avg, exp_avg_sq, 4-byte step per tensor)
    mem = r["memory"]
    assert mem["params"] == {"cpu": 4 * N_PARAMS}
    assert mem["grads"] == {"cpu": 4 * N_PARAMS}
    assert mem["optimizer"] == {"cpu": 8 * N_PARAMS + 4 * N_TENSORS}


def test_fp16_overflow_skips_step_and_rescales(job_cache):
    """Injected inf gradients at step 1: the step is skipped, parameters stay as they were, the
    scale halves (hysteresis 1); after loss_scale_window clean steps it doubles again."""
    for r in results(_out(job_cache, "fp16_overflow")):
        assert r["param_dtype"] == "torch.float16"
        assert r["skipped"] == [0, 1, 0, 0, 0, 0]
        assert r["param_sums"][1] == r["param_sums"][0]  # fp32 masters untouched
        assert r["param_sums"][2] != r["param_sums"][1]
        # scale used at each step: 2**8, overflow -> 2**7, grows after 2 clean updates
        assert r["scales"] == [256.0, 256.0, 128.0, 128.0, 128.0, 256.0]
        assert all(v == v for v in r["losses"])  # no NaN leaked into the weights
        mem = r["memory"]
        assert mem["params"] == {"cpu": 2 * N_PARAMS}  # fp16 model
        assert mem["optimizer"] == {"cpu": 4 * N_PARAMS + 8 * N_PARAMS + 4 * N_TENSORS}


def test_bf16_trains(job_cache):
    r0, r1 = results(_out(job_cache, "bf16"))
    assert r0["param_dtype"] == "torch.bfloat16"
    assert r0["losses"] == r1["losses"]
    assert sum(r0["losses"][-3:]) / 3 < r0["losses"][0] - 0.1, r0["losses"]
    assert r0["memory"]["params"] == {"cpu": 2 * N_PARAMS}
