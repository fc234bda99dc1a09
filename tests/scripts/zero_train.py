"""Trains the tiny GPT through dslaunch.initialize (config from the launcher) and writes, on rank
0, the per-step global losses, memory_breakdown() and comm_stats() as JSON.

    dslaunch run --nproc-per-node 2 tests/scripts/zero_train.py --config c.json --
        --steps 20 --out o.json [--save DIR --save-at K] [--load DIR] [--start K]
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
from train_steps import micro_steps  # noqa: E402

import dslaunch  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--out", required=True)
ap.add_argument("--save", default=None)
ap.add_argument("--save-at", type=int, default=-1)
ap.add_argument("--load", default=None)
ap.add_argument("--d-model", type=int, default=32)
a = ap.parse_args()

torch.manual_seed(0)
model = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=a.d_model))
numel = model.num_params()
engine, _, _, _ = dslaunch.initialize(model=model)
rank, world = dist.get_rank(), dist.get_world_size()
gas = engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 18), seq_len=32, global_batch=8)
start = 0
if a.load:
    engine.load_checkpoint(a.load)
    start = engine.global_steps
losses = {}
for step in range(start, a.steps):
    tot = micro_steps(engine, batches, step, gas, rank, world)
    dist.all_reduce(tot)
    losses[step] = tot.item() / world
    if step + 1 == a.save_at and a.save:
        engine.save_checkpoint(a.save)
if rank == 0:
    Path(a.out).write_text(json.dumps({
        "losses": losses, "numel": numel, "memory": engine.memory_breakdown(),
        "comm": engine.comm_stats(), "world": world,
        "optimizer": type(engine.optimizer).__name__,
        "most_in_flight": getattr(engine.strategy, "most_in_flight", None),
        "buckets": sum(len(g.layout.buckets) for g in getattr(engine.strategy, "groups", []))}))
dist.barrier()
dist.destroy_process_group()
