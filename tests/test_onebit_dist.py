"""1-bit optimizers end to end: real `dslaunch run` gloo jobs (2 and 4 ranks, the tiny example
GPT), the compressed all-reduce against an independent reference, error feedback, convergence
against the uncompressed optimizers, bytes booked in comm_stats(), accumulation, bf16 and
checkpoint resume.

Launches: every training run (the 60-step mechanics runs, accumulation, bf16, the 400-step
convergence runs, the runs that save a checkpoint) is one entry of ONE 2-rank `dslaunch run` of
onebit_train.py --runs (each entry from a fresh model and engine, records apart), the three
resumes a second; plus the compressed all-reduce at 2 and at 4 ranks. 4 launches, 10 ranks
(there were 21 launches, one per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import ROOT, launch, results

STEPS, FREEZE = 60, 20


def run_job(out: Path, script: str, *args, nproc=2, config=None, timeout=300):
    """The rank script under `dslaunch run`, the config given to the script itself
    (``--deepspeed_config``, as a DeepSpeed script takes it); each rank's record."""
    out.mkdir(parents=True, exist_ok=True)
    launch(out, config, script, ["--out", out, *args], nproc=nproc, timeout=timeout,
           config_flag="--deepspeed_config")
    return results(out, nproc)


def train_runs(out: Path, specs: dict, timeout=900) -> dict:
    """Every run of ``specs`` ({name: {"config": dict, onebit_train.py option: value}}) in turn
    in one 2-rank `dslaunch run` of onebit_train.py --runs (each from a fresh model and engine;
    its config file handed to dslaunch.initialize as --deepspeed_config); {name: each rank's
    record}."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, spec in specs.items():
        cfg = out / f"{name}.json"
        cfg.write_text(json.dumps(spec["config"]))
        runs.append({"name": name, "config": str(cfg),
                     **{k: str(v) if isinstance(v, Path) else v
                        for k, v in spec.items() if k != "config"}})
    (out / "runs.json").write_text(json.dumps(runs))
    launch(out, None, "onebit_train.py", ["--out", out, "--runs", out / "runs.json"],
           timeout=timeout)
    return {name: results(out / name) for name in specs}


def shipped(name: str, **params) -> dict:
    cfg = json.loads((ROOT / "configs" / f"{name}.json").read_text())
    cfg["optimizer"]["params"].update(params)
    return cfg


def plain(kind: str) -> dict:
    cfg = shipped("onebit_adam")
    cfg["optimizer"] = {"type": kind, "params": {"lr": 0.003, "betas": [0.9, 0.999],
                                                  "eps": 1e-8, "weight_decay": 0.0}}
    return cfg


def tail_mean(losses, n=10):
    return sum(losses[-n:]) / n


# -- the compressed all-reduce -----------------------------------------------------------------

@pytest.mark.parametrize("nproc", [2, 4])
def test_compressed_allreduce_equals_reference_and_error_feedback_is_bounded(tmp_path, nproc):
    recs = run_job(tmp_path / "ar", "onebit_allreduce.py", "--iters", 150, nproc=nproc)
    for rec in recs:
        for case, r in rec["exact"].items():
            assert r["max_abs_diff"] < 1e-6, (case, r)
            assert r["one_magnitude_per_block"], case
        curve = rec["drift"]
        first, last = curve[0], curve[-1]
        # with feedback the running sums stay a bounded distance apart ...
        assert last["feedback"] < 2.0 * first["feedback"] + 0.5
        assert last["feedback"] < 0.05 * last["true_rms"]
        # ... without it the gap keeps growing
        assert last["no_feedback"] > 2.0 * first["no_feedback"]
        assert last["no_feedback"] > 4.0 * last["feedback"]
        # bytes booked: one all_to_all and one all_gather per call, bytes as the layout says
        stats = rec["comm_stats"]
        assert stats["onebit_all_to_all"]["calls"] == stats["onebit_all_gather"]["calls"]
        assert stats["onebit_all_to_all"]["bytes"] > 0 and "all_reduce" not in stats


# -- mechanics: the shipped configs, 60 steps (freeze at 20) -----------------------------------

def bf16(cfg: dict) -> dict:
    return dict(cfg, bf16={"enabled": True})


def gas2(cfg: dict) -> dict:
    return dict(cfg, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)


CKPT_CONFIGS = ("onebit_adam", "onebit_zero_one_adam", "onebit_lamb")
CKPT_STEPS, CKPT_SAVE_AT = 50, 44  # compression stage for all three (0/1 Adam: phase 2 after 40)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """All the training runs but the resumes, in one launch (see the module docstring)."""
    base = tmp_path_factory.mktemp("onebit")
    short = {
        "adam": plain("Adam"),
        "onebit_adam": shipped("onebit_adam", freeze_step=FREEZE),
        "zero_one_adam": shipped("onebit_zero_one_adam"),
        "lamb": plain("Lamb"),
        "onebit_lamb": shipped("onebit_lamb", freeze_step=FREEZE),
        "onebit_adam_gas2": gas2(shipped("onebit_adam", freeze_step=FREEZE)),
        "bf16_adam": bf16(plain("Adam")),
        "bf16_onebit_adam": bf16(shipped("onebit_adam")),
    }
    specs = {name: {"config": cfg, "steps": STEPS} for name, cfg in short.items()}
    for kind in LONG_KINDS:
        specs[f"long_{kind}"] = {"config": long_config(kind), "steps": LONG,
                                 "eval_batches": HELD_OUT}
    for config in CKPT_CONFIGS:
        specs[f"full_{config}"] = {"config": shipped(config), "steps": CKPT_STEPS,
                                   "save_dir": base / "ckpt" / config, "save_at": CKPT_SAVE_AT}
    recs = train_runs(base, specs, timeout=1200)
    recs["ckpt_root"] = base / "ckpt"
    return recs


@pytest.fixture(scope="module")
def runs(trained):
    return trained


@pytest.mark.parametrize("name, baseline", [("onebit_adam", "adam"), ("onebit_lamb", "lamb")])
def test_warmup_is_the_uncompressed_optimizer(runs, name, baseline):
    got, ref = runs[name][0]["losses"][:FREEZE], runs[baseline][0]["losses"][:FREEZE]
    assert got == pytest.approx(ref, rel=1e-4)
    assert runs[name][0]["losses"][FREEZE + 5:] != pytest.approx(
        runs[baseline][0]["losses"][FREEZE + 5:], rel=1e-4)  # compression does change things


@pytest.mark.parametrize("name", ["onebit_adam", "zero_one_adam", "onebit_lamb"])
def test_ranks_end_with_identical_parameters(runs, name):
    a, b = runs[name]
    assert a["param_sha"] == b["param_sha"]


@pytest.mark.parametrize("name", ["onebit_adam", "onebit_lamb"])
def test_bytes_warmup_full_precision_then_compressed(runs, name):
    """Bytes each rank sends (comm_stats sent_bytes: ring all-reduce 2(N-1)/N of the buffer,
    all_gather its input to each peer, all_to_all all but its own slice), measured per step."""
    rec = runs[name][0]
    fp32 = runs["adam"][0]["step_sent"][-1]["all_reduce"]  # the Adam run's gradient all-reduce
    assert fp32 == 4 * rec["num_params"]  # 2 ranks: a ring sends the whole fp32 buffer once
    for step, (b, comp) in enumerate(zip(rec["step_sent"], rec["compressing"])):
        b = dict(b)  # (popped below: the record itself stays whole)
        if step < FREEZE:
            assert not comp and b == {"all_reduce": fp32}, (step, b)
        else:
            # the clipping norm: one float all-reduced (gradient_clipping defaults to 1.0)
            assert b.pop("all_reduce", 4) == 4, (step, b)
            assert comp and set(b) == {"onebit_all_to_all", "onebit_all_gather"}, (step, b)
            ratio = fp32 / sum(b.values())
            assert ratio >= 25 and ratio / 2 >= 12, ratio  # vs fp32 and vs bf16 gradients
            # the ideal ratio, less padding and one scale per parameter's chunk (-0.8% here)
            assert ratio == pytest.approx(32 / (1 + 32 / 2048), rel=0.01)
    # payload (what was handed to the collectives) is booked beside it
    assert set(rec["step_bytes"][-1]) == set(rec["step_sent"][-1])


@pytest.mark.parametrize("name", ["adam", "onebit_adam", "zero_one_adam", "onebit_lamb"])
def test_rows_that_never_get_a_gradient_never_move(runs, name):
    """1 bit cannot encode 0: without the zero-variance mask these embedding rows (bytes absent
    from the text) came back as +-scale and moved by scale/eps, thousands per step."""
    rec = runs[name][0]
    assert rec["absent_rows"] > 50
    assert rec["absent_rows_moved"] == 0.0, rec["absent_rows_moved"]


def test_zero_one_adam_full_precision_only_on_variance_steps(runs):
    rec = runs["zero_one_adam"][0]
    cfg = shipped("onebit_zero_one_adam")["optimizer"]["params"]
    fp32 = 4 * rec["num_params"]
    full = [s + 1 for s, b in enumerate(rec["step_bytes"]) if b.get("all_reduce") == fp32]
    # var_update_scaler=4: steps 1-4 every step, then every 2nd, 4th, 8th ... up to var_freeze_step
    expect, t, interval, count = [], 1, 1, 0
    while t <= cfg["var_freeze_step"]:
        if t % interval == 0:
            expect.append(t)
            count += 1
            if count == cfg["var_update_scaler"]:
                count, interval = 0, interval * 2
        t += 1
    assert full == expect
    compressed = [s + 1 for s, b in enumerate(rec["step_bytes"]) if "onebit_all_to_all" in b]
    assert set(full).isdisjoint(compressed)
    # phase 2 (after var_freeze_step): local steps, so fewer compressed syncs than steps
    later = [t for t in compressed if t > cfg["var_freeze_step"]]
    assert 0 < len(later) < STEPS - cfg["var_freeze_step"]


# -- convergence: 15% warmup ----------------------------------------------------------------------
# 400 steps, freeze_step / var_freeze_step 60, every optimizer under the same WarmupDecayLR (10%
# lr warmup, linear decay to 0), final loss = mean loss on 8 held-out batches. Measured with this
# code: 1-bit Adam +1.9% vs Adam, 0/1 Adam -1.0%, 1-bit LAMB +3.4% vs LAMB (0/1 Adam was +3.1%
# before its phase-2 fix and per-parameter scales; +2.4% with the fix alone; 1-bit LAMB with
# per-parameter scales was +6.0%, so it keeps one buffer as DeepSpeed's; earlier variants of the
# code and seeds moved these by about +-1%, 0/1 Adam by more: +14.7% at 1000 steps with seed 1).
# The 2% is not reached at this length (the variance frozen at step 60 comes from
# early, larger gradients); at 1000 steps it is for 1-bit Adam (-0.2%) and 1-bit LAMB (+1.4%),
# for 0/1 Adam only without 1-bit gradients in phase 1 (var_update_scaler >= var_freeze_step):
# benchmarks/results/onebit-zero-one-*-1000steps*.json; why, measured variant by variant (sparse
# variance samples and 1-bit gradients in phase 1, local steps in phase 2):
# benchmarks/results/onebit-zero-one-ablation-1000steps.json. The bound here is 5%, which still
# fails on the defects found (m/denom compression +18% at 400 steps; NaN without the momentum
# clamp; +21% at 1000 steps for 0/1 Adam without it).
LONG, LONG_FREEZE, HELD_OUT = 400, 60, 8
LONG_KINDS = ("Adam", "OneBitAdam", "ZeroOneAdam", "Lamb", "OneBitLamb")


def long_config(kind: str) -> dict:
    lamb = "Lamb" in kind
    params = {"lr": 0.01 if lamb else 0.003, "betas": [0.9, 0.999], "eps": 1e-8,
              "weight_decay": 0.0}
    if kind in ("OneBitAdam", "OneBitLamb"):
        params["freeze_step"] = LONG_FREEZE
    if kind == "ZeroOneAdam":
        params.update(var_freeze_step=LONG_FREEZE, var_update_scaler=16,
                      local_step_scaler=(LONG - LONG_FREEZE) // 4, local_step_clipper=4)
    return {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
            "steps_per_print": 10 ** 9, "optimizer": {"type": kind, "params": params},
            "scheduler": {"type": "WarmupDecayLR", "params": {
                "total_num_steps": LONG, "warmup_num_steps": LONG // 10, "warmup_min_lr": 0.0,
                "warmup_max_lr": params["lr"], "warmup_type": "linear"}}}


@pytest.fixture(scope="module")
def long_runs(trained):
    return {kind: trained[f"long_{kind}"] for kind in LONG_KINDS}


@pytest.mark.parametrize("name, baseline", [("OneBitAdam", "Adam"), ("ZeroOneAdam", "Adam"),
                                            ("OneBitLamb", "Lamb")])
def test_final_loss_at_15_percent_warmup_tracks_the_uncompressed_optimizer(long_runs, name,
                                                                             baseline):
    got, ref = long_runs[name][0], long_runs[baseline][0]
    assert ref["eval_loss"] < 0.5 * ref["losses"][0]  # the baseline itself learned
    gap = (got["eval_loss"] - ref["eval_loss"]) / ref["eval_loss"]
    print(f"{name} vs {baseline}: held-out {got['eval_loss']:.4f} vs {ref['eval_loss']:.4f} "
          f"({100 * gap:+.2f}%), train last 40 {tail_mean(got['losses'], 40):.4f} vs "
          f"{tail_mean(ref['losses'], 40):.4f}")
    assert abs(gap) < 0.05, (name, got["eval_loss"], ref["eval_loss"])
    assert got["param_sha"] == long_runs[name][1]["param_sha"]  # ranks agree at the end


def test_end_to_end_bytes_at_15_percent_warmup(long_runs):
    """Bytes each rank sent over the whole run (comm_stats sent_bytes), 1-bit Adam vs Adam:
    15% of the steps at fp32, 85% at ~1/31.5: (0.15 + 0.85 / 31.5)^-1 = 5.6x."""
    total = {k: sum(sum(b.values()) for b in long_runs[k][0]["step_sent"])
             for k in ("Adam", "OneBitAdam", "OneBitLamb")}
    for name in ("OneBitAdam", "OneBitLamb"):
        ratio = total["Adam"] / total[name]
        assert ratio >= 4, (name, ratio)
        assert ratio == pytest.approx(1 / (0.15 + 0.85 / (32 / (1 + 32 / 2048))), rel=0.02)


# -- accumulation, bf16, checkpoints -------------------------------------------------------------

def test_gradient_accumulation_matches_one_big_micro_batch(runs):
    rec = runs["onebit_adam_gas2"][0]  # micro-batch 4 x 2 accumulation steps
    ref = runs["onebit_adam"][0]["losses"]
    assert rec["losses"][:FREEZE] == pytest.approx(ref[:FREEZE], rel=1e-4)
    assert abs(tail_mean(rec["losses"]) - tail_mean(ref)) / tail_mean(ref) < 0.02
    assert rec["step_bytes"][-1] == runs["onebit_adam"][0]["step_bytes"][-1]  # once per step


def test_bf16_onebit_adam_tracks_bf16_adam(runs):
    rec = {"adam": runs["bf16_adam"], "onebit": runs["bf16_onebit_adam"]}
    a, b = tail_mean(rec["adam"][0]["losses"]), tail_mean(rec["onebit"][0]["losses"])
    assert abs(a - b) / a < 0.02, (a, b)
    assert rec["onebit"][0]["param_sha"] == rec["onebit"][1]["param_sha"]
    assert "onebit_all_to_all" in rec["onebit"][0]["step_bytes"][-1]


@pytest.fixture(scope="module")
def resumed(trained, tmp_path_factory):
    """The three resumes from the step-44 checkpoints of the ``full_*`` runs, in one launch."""
    return train_runs(tmp_path_factory.mktemp("onebit_resumed"),
                      {config: {"config": shipped(config), "steps": CKPT_STEPS,
                                "load_dir": trained["ckpt_root"] / config}
                       for config in CKPT_CONFIGS})


@pytest.mark.parametrize("config", CKPT_CONFIGS)
def test_checkpoint_resume_in_compression_stage_is_exact(trained, resumed, config):
    ckpt = trained["ckpt_root"] / config
    full, again = trained[f"full_{config}"], resumed[config]
    assert again[0]["start"] == CKPT_SAVE_AT
    assert again[0]["losses"] == pytest.approx(full[0]["losses"][CKPT_SAVE_AT:], rel=1e-6,
                                               abs=1e-6)
    assert again[0]["param_sha"] == full[0]["param_sha"]
    # the error buffers are in each rank's optimizer state, and they differ between ranks
    states = [torch.load(ckpt / "ckpt" / f"rank_{r}_optim_states.pt", weights_only=False)
              for r in range(2)]
    errors = [s["strategy"]["optimizer"]["onebit"]["errors"] for s in states]
    assert all(e["worker_error"].abs().sum() > 0 for e in errors)
    assert not torch.equal(errors[0]["worker_error"], errors[1]["worker_error"])
