"""A dslaunch engine job for in-process recovery: ``recover_train.py STEPS [CONFIG_JSON]``.

The data of step S is a function of S alone (the global batch of the step, split over the
ranks), so a job that loses a rank mid-step and rolls back sees the same batches as a fault-free
one. Rank 0 prints ``step S loss L`` (its own share's loss, 8 decimals: no collective of the
script's own between steps, which a recovery could not resume) and every rank prints
``rank R pid P start`` once and ``rank R pid P done`` at the end.
"""

import json
import os
import sys

import torch

import dslaunch

steps = int(sys.argv[1])
config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5,
                                                       "warmup_max_lr": 1e-2}},
          "steps_per_print": 10 ** 6, **config}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
engine, *_ = dslaunch.initialize(model=model, config=config)
rank, world = engine.global_rank, engine.world_size
print(f"rank {rank} pid {os.getpid()} start at step {engine.global_steps}", flush=True)
micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()


def batch(step: int, micro_step: int):
    g = torch.Generator().manual_seed(1000 * step + micro_step)
    x = torch.randn(micro * world, 16, generator=g)
    y = x[:, :1].sin() + 0.1 * x[:, 1:2]
    share = slice(rank * micro, (rank + 1) * micro)
    return x[share], y[share]


while engine.global_steps < steps:
    step = engine.global_steps
    losses = []
    for m in range(gas):
        x, y = batch(step, m)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    if engine.global_steps == step + 1:  # the step happened (not rolled back by a recovery)
        if rank == 0:
            print(f"step {engine.global_steps} loss {torch.stack(losses).mean().item():.8f}",
                  flush=True)
print(f"rank {rank} pid {os.getpid()} done", flush=True)
