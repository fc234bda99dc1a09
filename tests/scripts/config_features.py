"""Rank script for tests/test_config_features.py: config sections DeepSpeed 0.19 scripts use.

``--mode`` picks the cases; each builds a fresh engine on tiny_mlp's model and data, trains a few
steps and records what the test compares with a single-process torch reference. Every rank writes
``--out/rank_{r}.json``: {case: {"losses": [...], "params": {name: values}, ...}}.

- ``reduce``: ``gradient_allreduce_op: "sum"`` (SGD, stages 0-3) and
  ``managed_gradient_accumulation: false`` (AdamW, stages 0-3, a varying number of backwards
  before each step()).
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_mlp import MICRO, batch, model

import dslaunch
from dslaunch.utils import safe_get_full_fp32_param

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True)
ap.add_argument("--out", required=True)
a = ap.parse_args()

SGD = {"type": "SGD", "params": {"lr": 0.1}}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}
UNMANAGED_BACKWARDS = (1, 3, 2)  # backward() calls before each step()


def config(stage, optimizer, gas=1, **extra):
    zero = {"stage": stage, "reduce_bucket_size": 64, "stage3_param_persistence_threshold": 0}
    zero.update(extra.pop("zero", {}))
    # no clipping (DeepSpeed's default clips at 1.0): the tests' hand-written references do not clip
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
            "optimizer": optimizer, "steps_per_print": 1000, "zero_optimization": zero,
            "gradient_clipping": 0.0, **extra}


def params(engine):
    return {n: safe_get_full_fp32_param(p).reshape(-1).tolist()
            for n, p in engine.module.named_parameters()}


def summed(stage):
    engine, *_ = dslaunch.initialize(model=model(), config=config(
        stage, SGD, gradient_allreduce_op="sum"))
    losses = []
    for step in range(2):
        loss = engine(*batch(step, 0, dist.get_rank()))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"losses": losses, "params": params(engine)}


def unmanaged(stage, overlap=None):
    zero = {} if overlap is None else {"overlap_comm": overlap}
    engine, *_ = dslaunch.initialize(model=model(), config=config(
        stage, ADAMW, gas=2, managed_gradient_accumulation=False, zero=zero))
    try:
        engine.set_gradient_accumulation_boundary(True)
        refused = ""
    except AssertionError as e:
        refused = str(e)
    losses, samples, boundaries = [], [], []
    for step, n in enumerate(UNMANAGED_BACKWARDS):
        step_losses = []
        for micro in range(n):
            loss = engine(*batch(step, micro, dist.get_rank()))
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.backward(loss)
            step_losses.append(loss.item())
        engine.step()
        losses.append(step_losses)
        samples.append(engine.global_samples)
    return {"losses": losses, "params": params(engine), "global_samples": samples,
            "global_steps": engine.global_steps, "boundary_in_backward": boundaries,
            "set_boundary_refused": refused,
            "managed": engine.managed_gradient_accumulation()}


def reduce_cases():
    out = {}
    for stage in (0, 1, 2, 3):
        out[f"sum_stage{stage}"] = summed(stage)
        out[f"unmanaged_stage{stage}"] = unmanaged(stage)
    out["unmanaged_stage0_overlap"] = unmanaged(0, overlap=True)
    return out


def comm_bytes(engine) -> int:
    """Bytes this rank sent in gradient reductions (reduce-scatters and all-reduces)."""
    stats = engine.comm_stats()
    return sum(stats.get(k, {}).get("bytes", 0) for k in ("reduce_scatter", "all_reduce"))


def autocast_run(stage, autocast):
    extra = {"torch_autocast": {"enabled": True, "dtype": "bf16"}} if autocast else {}
    net = model()
    engine, *_ = dslaunch.initialize(model=net, config=config(stage, ADAMW, **extra))
    losses = []
    for step in range(3):
        loss = engine(*batch(step, 0, dist.get_rank()))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"losses": losses, "params": params(engine), "seen_dtypes": sorted(set(net.seen_dtypes)),
            "param_dtypes": sorted({str(p.dtype) for p in net.parameters()}),
            "grad_bytes": comm_bytes(engine)}


def autocast_cases():
    out = {}
    for stage in (0, 1, 2, 3):
        out[f"autocast_stage{stage}"] = autocast_run(stage, True)
        out[f"fp32_stage{stage}"] = autocast_run(stage, False)
    return out


def state_dtypes(engine) -> list:
    return sorted({str(t.dtype) for st in engine.optimizer.state.values() for t in st.values()
                   if torch.is_tensor(t) and t.numel() > 1})


def bf16_run(stage, lean=True, states=True, offload=False):
    bf16 = {"enabled": True}
    if lean:
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=states)
    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    engine, *_ = dslaunch.initialize(model=model(), config=config(stage, ADAMW, bf16=bf16,
                                                                  zero=zero))
    losses = []
    for step in range(3):
        loss = engine(*batch(step, 0, dist.get_rank()))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"losses": losses, "params": params(engine), "state_dtypes": state_dtypes(engine),
            "memory": engine.memory_breakdown(), "optimizer": type(engine.optimizer).__name__,
            "compiled": bool(getattr(engine.optimizer, "compiled", False))}


def lean_resume(stage, save_dir):
    """Train 2 steps, save, train a third; a fresh engine loads the checkpoint and trains the
    third step again: the same loss and weights are expected."""
    def engine():
        bf16 = {"enabled": True, "bf16_master_weights_and_grads": True,
                "bf16_optimizer_states": True}
        return dslaunch.initialize(model=model(seed=1), config=config(stage, ADAMW, bf16=bf16))[0]

    def one_step(e, step):
        loss = e(*batch(step, 0, dist.get_rank()))
        e.backward(loss)
        e.step()
        return loss.item()

    first = engine()
    for step in range(2):
        one_step(first, step)
    first.save_checkpoint(save_dir, tag="two")
    third = one_step(first, 2)
    second = engine()
    second.load_checkpoint(save_dir, tag="two")
    return {"third": third, "resumed": one_step(second, 2),
            "params": params(first), "resumed_params": params(second),
            "state_dtypes": state_dtypes(second)}


def bf16_cases():
    out = {}
    for stage in (0, 2, 3):
        out[f"lean_resume_stage{stage}"] = lean_resume(stage, f"{a.out}/ckpt{stage}")
    for stage in (0, 1, 2, 3):
        out[f"lean_stage{stage}"] = bf16_run(stage)
        out[f"bf16_stage{stage}"] = bf16_run(stage, lean=False)
    for stage in (1, 3):  # the CPU Adam keeps fp32 states for bf16 masters, or bf16 ones
        out[f"lean_offload_stage{stage}"] = bf16_run(stage, states=False, offload=True)
        out[f"lean_offload_bf16states_stage{stage}"] = bf16_run(stage, offload=True)
    return out


MODES = {"reduce": reduce_cases, "autocast": autocast_cases, "bf16": bf16_cases}

result = MODES[a.mode]()
Path(a.out).mkdir(parents=True, exist_ok=True)
(Path(a.out) / f"rank_{dist.get_rank()}.json").write_text(json.dumps(result))
