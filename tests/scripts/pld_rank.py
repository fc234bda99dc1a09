"""Progressive layer drop as a model uses it: a residual stack whose forward takes DeepSpeed's
PLD keyword arguments (``progressive_layer_drop``, ``pld_theta``) and keeps each block with the
probability ``pld_theta`` (a seeded draw per forward, so runs compare). Prints one line per
training forward, ``THETA <forward> <value or None>``, and per step, ``LOSS <step> <loss>``;
``EVAL <value>`` for an evaluation forward (which gets no PLD arguments).

    pld_rank.py --runtime dslaunch|deepspeed --config CONFIG.json [--steps N]

The same file runs under DeepSpeed (``--runtime deepspeed``: ``import deepspeed``, torchrun) to
compare the schedules.
"""

import argparse
import importlib
import json

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--runtime", choices=["dslaunch", "deepspeed"], default="dslaunch")
p.add_argument("--config", required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--local_rank", type=int, default=0)
args = p.parse_args()
ds = importlib.import_module(args.runtime)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.head = nn.Linear(8, 1)
        self.forwards = 0
        self.thetas = []

    def forward(self, x, y, progressive_layer_drop=False, pld_theta=None):
        if self.training:
            self.forwards += 1
            print(f"THETA {self.forwards} {pld_theta if progressive_layer_drop else None}",
                  flush=True)
        g = torch.Generator().manual_seed(1000 + self.forwards)
        for block in self.blocks:
            keep = torch.rand((), generator=g).item() < pld_theta if progressive_layer_drop \
                else True
            if keep:
                x = x + torch.tanh(block(x))
        return ((self.head(x) - y) ** 2).mean()


torch.manual_seed(0)
model = Stack()
with open(args.config) as f:
    config = json.load(f)
engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
gas = config.get("gradient_accumulation_steps", 1)
for step in range(args.steps):
    for micro in range(gas):
        g = torch.Generator().manual_seed(step * 10 + micro)
        x = torch.randn(4, 8, generator=g)
        loss = engine(x, x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    print(f"LOSS {step} {loss.item():.6f}", flush=True)
engine.eval()
with torch.no_grad():
    print(f"EVAL {engine(x, x.sum(1, keepdim=True)).item():.6f}", flush=True)
