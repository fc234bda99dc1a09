"""Optimizers other than Adam with their states on NVMe: for each optimizer type, trains the tiny
GPT twice in this process (offload_optimizer cpu, then nvme; the same ZeRO stage) and writes, on
rank 0, both loss lists and the optimizer classes as JSON.

    dslaunch run --nproc-per-node 2 tests/scripts/nvme_optimizers.py -- --nvme-path DIR
        --out o.json [--stage 1] [--steps 4] [--types SGD,Lamb,Adagrad,AdamW]

AdamW runs in bf16 (the compiled CPU Adam on fp32 masters), the others in fp32.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dslaunch  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

PARAMS = {"SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
          "Lamb": {"lr": 3e-3, "weight_decay": 0.01}, "Adagrad": {"lr": 0.05},
          "AdamW": {"lr": 3e-3, "weight_decay": 0.1}}
BF16 = ("AdamW",)  # trained in bf16 (fp32 masters on the CPU, the compiled CPU Adam)

ap = argparse.ArgumentParser()
ap.add_argument("--nvme-path", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--stage", type=int, default=1)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--types", default="SGD,Lamb,Adagrad,AdamW")
a = ap.parse_args()


def train(opt_type: str, device: str):
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=32))
    off = {"device": device}
    if device == "nvme":
        off.update(nvme_path=a.nvme_path, buffer_count=2)
    cfg = {"train_batch_size": 8, "steps_per_print": 1000,
           "optimizer": {"type": opt_type, "params": PARAMS[opt_type]},
           "zero_optimization": {"stage": a.stage, "reduce_bucket_size": 8000,
                                 "sub_group_size": 3000, "offload_optimizer": off}}
    if opt_type in BF16:
        cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = dslaunch.initialize(model=model, config=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = TextBatches(stdlib_bytes(1 << 18), seq_len=32, global_batch=8)
    losses = []
    for step in range(a.steps):
        tok, tgt = batches.batch_at(step, rank, world)
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        tot = loss.detach().float().reshape(1)
        dist.all_reduce(tot)
        losses.append(tot.item() / world)
    inner = getattr(engine.optimizer, "inner", engine.optimizer)
    spec = [k for k, _ in engine.optimizer.spec] if device == "nvme" else None
    return {"losses": losses, "optimizer": type(inner).__name__, "swapped": spec}


results = {t: {dev: train(t, dev) for dev in ("cpu", "nvme")} for t in a.types.split(",")}
if dist.get_rank() == 0:
    Path(a.out).write_text(json.dumps(results))
dist.barrier()
dist.destroy_process_group()
