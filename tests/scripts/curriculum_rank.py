"""The legacy seqlen curriculum as a model uses it: the forward takes ``curriculum_seqlen`` and
trains on the first that many tokens of each sample. Prints ``SEQLEN <forward> <value or None>``
per training forward and ``LOSS <step> <loss>`` per step.

    curriculum_rank.py --runtime dslaunch|deepspeed --config CONFIG.json [--steps N]
"""

import argparse
import importlib
import json

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--runtime", choices=["dslaunch", "deepspeed"], default="dslaunch")
p.add_argument("--config", required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--local_rank", type=int, default=0)
args = p.parse_args()
ds = importlib.import_module(args.runtime)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32)
        self.forwards = 0

    def forward(self, tokens, curriculum_seqlen=None):
        if self.training:
            self.forwards += 1
            print(f"SEQLEN {self.forwards} {curriculum_seqlen}", flush=True)
        if curriculum_seqlen is not None and curriculum_seqlen < tokens.size(1):
            tokens = tokens[:, :curriculum_seqlen]
        logits = self.head(self.embed(tokens[:, :-1]))
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


torch.manual_seed(0)
model = TinyLM()
with open(args.config) as f:
    config = json.load(f)
engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
gas = config.get("gradient_accumulation_steps", 1)
for step in range(args.steps):
    for micro in range(gas):
        g = torch.Generator().manual_seed(step * 10 + micro)
        start = torch.randint(0, 32, (4, 1), generator=g)
        tokens = (start + torch.arange(64)) % 32  # counting sequences: learnable
        loss = engine(tokens)
        engine.backward(loss)
        engine.step()
    print(f"LOSS {step} {loss.item():.6f}", flush=True)
