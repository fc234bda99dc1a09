"""Trains the tiny GPT with a ZeRO strategy driven directly (no engine), or the plain
single-process reference (--ref). Writes per-step losses (and memory) as JSON on rank 0.
Ranks come from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT."""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--stage", type=int, default=1)
ap.add_argument("--precision", default="fp32")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--gas", type=int, default=1)
ap.add_argument("--clip", type=float, default=0.0)
ap.add_argument("--bucket", type=int, default=20000)
ap.add_argument("--offload", action="store_true")
ap.add_argument("--overlap", type=int, default=1)
ap.add_argument("--ref", action="store_true")
ap.add_argument("--out", required=True)
a = ap.parse_args()

torch.manual_seed(0)
cfg = GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=32)
model = GPT(cfg)
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.precision]
batches = TextBatches(stdlib_bytes(1 << 18), seq_len=32, global_batch=8)
losses = []
if a.ref:
    model.to(dtype)
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=3e-3, weight_decay=0.1)
    for step in range(a.steps):
        tot = 0.0
        for m in range(a.gas):
            tok, tgt = batches.batch_at(step * a.gas + m)
            loss = model(tok, tgt) / a.gas
            loss.backward()
            tot += loss.item()
        for mp, p in zip(master, model.parameters()):
            mp.grad = p.grad.float()
            p.grad = None
        if a.clip:
            torch.nn.utils.clip_grad_norm_(master, a.clip)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for mp, p in zip(master, model.parameters()):
                p.copy_(mp)
        losses.append(tot)
    Path(a.out).write_text(json.dumps({"losses": losses}))
    sys.exit(0)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
from dslaunch.engine.zero.stage12 import ZeroStage12Strategy  # noqa: E402

model.to(dtype)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
zc = {"stage": a.stage, "reduce_bucket_size": a.bucket, "overlap_comm": bool(a.overlap)}
if a.offload:
    zc["offload_optimizer"] = {"device": "cpu"}
strat = ZeroStage12Strategy(a.stage, model, opt, {"zero_optimization": zc})
for step in range(a.steps):
    tot = torch.zeros(1)
    for m in range(a.gas):
        tok, tgt = batches.batch_at(step * a.gas + m, rank, world)
        loss = model(tok, tgt) / a.gas
        loss.backward()
        strat.after_backward(m == a.gas - 1)
        tot += loss.detach().float()
    strat.step(a.clip or None, None)
    strat.zero_grad()
    dist.all_reduce(tot)
    losses.append(tot.item() / world)
if rank == 0:
    Path(a.out).write_text(json.dumps({"losses": losses, "memory": strat.memory_breakdown(),
                                       "numel": sum(p.numel() for p in model.parameters())}))
dist.destroy_process_group()
print("after destroy", flush=True)
