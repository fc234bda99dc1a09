"""Rank script (tests/test_universal_checkpoint.py): the tiny GPT of
tests/fixtures/universal_ckpt on the fixture's global batches (``[tokens, targets]`` of each
step; rank r takes rows r::world).

``--save DIR``: train the first ``steps_before_save`` steps, ``save_checkpoint(DIR)``, then the
next ones; ``--load DIR``: ``load_checkpoint(DIR)`` (the config says ``load_universal``), then the
next ones. Writes the rank-mean losses of the steps after the save / load to
<out>/rank_<r>.json."""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import torch
import torch.distributed as dist

import dslaunch
from gpt import GPT, GPTConfig

p = argparse.ArgumentParser()
p.add_argument("--fixture", required=True)
p.add_argument("--save")
p.add_argument("--load")
p.add_argument("--out", required=True)
args = p.parse_args()
fix = json.loads(Path(args.fixture).read_text())
dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0 if args.save else 1)  # a load must set every weight itself
engine, *_ = dslaunch.initialize(model=GPT(GPTConfig(**fix["model"])))


def train(steps):
    losses = []
    for s in steps:
        tok, tgt = (torch.tensor(t)[rank::world].contiguous() for t in fix["batches"][str(s)])
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    return losses


n = fix["steps_before_save"]
if args.save:
    train(range(n))
    engine.save_checkpoint(args.save)
else:
    engine.load_checkpoint(args.load)
    assert engine.global_steps == n, engine.global_steps
losses = train(range(n, len(fix["batches"])))
os.makedirs(args.out, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps({"losses": losses}))
