"""Rank script for tests/test_job_view.py: a tiny token model trained by the engine (token ids,
so the engine counts tokens/s), one line per step. Runs --steps steps, then, with --hold FILE,
goes on stepping until FILE exists (all ranks agree through one collective per step), so a test
can look at the job while it runs."""

import argparse
import os

import torch

import dslaunch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--hold")
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 8, 1))
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "steps_per_print": 10 ** 9}
engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(), config=config)
rank = engine.global_rank


def held() -> bool:
    if not args.hold:
        return False
    flag = torch.tensor([0.0 if os.path.exists(args.hold) else 1.0])
    engine.comm.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)  # one answer for every rank
    return bool(flag.item())


while engine.global_steps < args.steps or held():
    g = torch.Generator().manual_seed(engine.global_steps * 10 + rank)
    ids = torch.randint(0, 64, (4, 8), generator=g)
    loss = engine(ids).pow(2).mean()
    engine.backward(loss)
    engine.step()
    print(f"STEP {rank} {engine.global_steps}", flush=True)
print(f"DONE {rank} {engine.global_steps}", flush=True)
