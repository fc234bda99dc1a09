"""Rank script for the engine tests: trains the tiny example GPT through dslaunch's public API and
writes what it saw (per-step global mean loss, lr, loss scale, stats) to --out/rank_{r}.json.

Data: TextBatches(global batch = train_batch_size).batch_at(step, rank, world), cut into the
gradient-accumulation micro-batches in order, so any (ranks x micro x accum) layout sees exactly
the rows a single process sees at the same step.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dslaunch
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--save-dir")
p.add_argument("--save-at", type=int, default=-1, help="save after this many steps")
p.add_argument("--save-tag")
p.add_argument("--load-dir")
p.add_argument("--inject-inf", default="", help="comma list of steps whose grads become inf")
p.add_argument("--user-optimizer", action="store_true")
dslaunch.add_config_arguments(p)
args = p.parse_args()

torch.manual_seed(args.seed)
model = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if args.user_optimizer else None
engine, optimizer, _, scheduler = dslaunch.initialize(
    args=args, model=model, optimizer=optimizer, model_parameters=model.parameters())
rank, world = engine.global_rank, engine.world_size
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=engine.train_batch_size(),
                      seed=args.seed)
inject = {int(s) for s in args.inject_inf.split(",") if s}

start = 0
client = None
if args.load_dir:
    _, client = engine.load_checkpoint(args.load_dir)
    start = engine.global_steps

rec = {"rank": rank, "world": world, "start": start, "losses": [], "lrs": [], "scales": [],
       "skipped": [], "param_sums": [], "client_state": client}
for step in range(start, args.steps):
    tokens, targets = batches.batch_at(step, rank, world)
    total = torch.zeros(())
    for i in range(gas):
        loss = engine(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
        total += loss.detach().float()
        engine.backward(loss)
        if step in inject and engine.is_gradient_accumulation_boundary():
            for prm in engine.module.parameters():
                if prm.grad is not None:
                    prm.grad.fill_(float("inf"))
            for prm in engine.optimizer.param_groups[0]["params"]:
                if prm.grad is not None:
                    prm.grad.fill_(float("inf"))
        skipped_before = engine.skipped_steps
        rec["scales"].append(engine.loss_scale) if engine.is_gradient_accumulation_boundary() else None
        engine.step()
    mean = total / gas
    dist.all_reduce(mean)  # outside the engine: the global loss, for the comparison only
    rec["losses"].append(mean.item() / world)
    rec["lrs"].append(engine.get_lr()[0])
    rec["skipped"].append(engine.skipped_steps - skipped_before)
    rec["param_sums"].append(sum(t.detach().double().abs().sum().item()
                                 for g in engine.optimizer.param_groups for t in g["params"]))
    if args.save_dir and step + 1 == args.save_at:
        engine.save_checkpoint(args.save_dir, tag=args.save_tag, client_state={"step": step + 1})

rec["scale_after"] = engine.loss_scale
rec["comm"] = engine.comm_stats()
rec["memory"] = engine.memory_breakdown()
rec["global_steps"] = engine.global_steps
rec["global_samples"] = engine.global_samples
rec["micro_steps"] = engine.micro_steps
rec["param_dtype"] = str(next(engine.module.parameters()).dtype)
rec["num_params"] = sum(t.numel() for t in engine.module.parameters())
rec["num_tensors"] = len(list(engine.module.parameters()))
os.makedirs(args.out, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(rec))
torch.save({k: v.detach().float() for k, v in engine.module.state_dict().items()},
           Path(args.out, f"rank_{rank}_final.pt"))
