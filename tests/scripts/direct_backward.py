"""Rank script for tests/test_direct_backward.py: PyTorch-style ``loss.backward()`` against
``engine.backward(loss)``.

For each ZeRO stage in ``--stages``, two fresh engines over the same model and data (each rank its
own micro-batches, 2 accumulation steps, gradient clipping on): one trained with
``engine.backward(loss)``, one with ``loss.backward()`` (``--fp16``: with
``engine.scale(loss).backward()``). Writes per stage the losses and the whole fp32 weights after
training to ``--out/rank_{r}.json``.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dslaunch
from dslaunch.utils import safe_get_full_fp32_param

ap = argparse.ArgumentParser()
ap.add_argument("--stages", default="0,1,2,3")
ap.add_argument("--fp16", action="store_true")
ap.add_argument("--out", required=True)
a = ap.parse_args()

STEPS, GAS = 3, 2


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train(stage, direct):
    dslaunch.init_distributed()
    cfg = {"train_batch_size": 4 * GAS * dist.get_world_size(), "gradient_accumulation_steps": GAS,
           "gradient_clipping": 0.05, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    if a.fp16:
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 4}
    engine, *_ = dslaunch.initialize(model=model(), config=cfg)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(STEPS * GAS):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        if not direct:
            engine.backward(loss)
        elif a.fp16:
            engine.scale(loss).backward()
        else:
            loss.backward()
        engine.step()
        losses.append(loss.item())
    weights = {n: safe_get_full_fp32_param(p).tolist() for n, p in engine.module.named_parameters()}
    engine.destroy()
    return {"losses": losses, "weights": weights, "steps": engine.global_steps}


out = {}
for stage in map(int, a.stages.split(",")):
    out[stage] = {"engine": train(stage, direct=False), "direct": train(stage, direct=True)}
Path(a.out).mkdir(parents=True, exist_ok=True)
(Path(a.out) / f"rank_{dist.get_rank()}.json").write_text(json.dumps(out))
