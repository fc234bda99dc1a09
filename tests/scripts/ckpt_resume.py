"""Rank script for the checkpoint resilience tests: resumes with no code of its own beyond
DeepSpeed's pattern (``engine.load_checkpoint(dir)`` at start: ``(None, None)`` when there is
nothing), trains the tiny example GPT on the global batch of each step (TextBatches: the same
rows whatever the world size), saves every --save-every steps with the data position in
client_state, and writes what it saw to --out/rank_{r}.json.
"""

import argparse
import json
import os
import random
import sys
import warnings
from pathlib import Path

import numpy
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dslaunch
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--save-dir", required=True)
p.add_argument("--save-every", type=int, default=2)
p.add_argument("--async-save", type=int, default=None, help="1/0: override the config")
p.add_argument("--keep-last", type=int, default=None)
dslaunch.add_config_arguments(p)
args = p.parse_args()

torch.manual_seed(0)
random.seed(0)  # saved with the RNG states: the same in every run
numpy.random.seed(0)
model = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
engine, _, _, _ = dslaunch.initialize(args=args, model=model, model_parameters=model.parameters())
rank, world = engine.global_rank, engine.world_size
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=engine.train_batch_size())

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path, client = engine.load_checkpoint(args.save_dir)
start = engine.global_steps
assert client is None or client["samples_seen"] == engine.global_samples, client
rec = {"rank": rank, "world": world, "start": start, "loaded": path, "client_state": client,
       "no_checkpoint_warning": any("nothing loaded" in str(w.message) for w in caught),
       "batch": [engine.train_batch_size(), mb, gas], "losses": []}
for step in range(start, args.steps):
    tokens, targets = batches.batch_at(step, rank, world)
    total = torch.zeros(())
    for i in range(gas):
        loss = engine(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
        total += loss.detach().float()
        engine.backward(loss)
        engine.step()
    mean = total / gas
    dist.all_reduce(mean)  # the global loss, for the comparison only
    rec["losses"].append(mean.item() / world)
    if (step + 1) % args.save_every == 0:
        engine.save_checkpoint(args.save_dir, client_state={"samples_seen": engine.global_samples},
                               async_save=None if args.async_save is None else bool(args.async_save),
                               keep_last=args.keep_last)
engine.wait_checkpoint()
os.makedirs(args.out, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(rec))
