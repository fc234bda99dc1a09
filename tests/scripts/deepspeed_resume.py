"""Rank script: load a DeepSpeed-written checkpoint (tests/fixtures/deepspeed_ckpt) and train the
fixture's next two steps on this rank's rows; write the rank-mean losses to <out>/rank_<r>.json."""

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
p.add_argument("--ckpt", required=True)
p.add_argument("--fixture", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()
fix = json.loads(Path(args.fixture).read_text())
dslaunch.init_distributed()
torch.manual_seed(1)
engine, *_ = dslaunch.initialize(model=GPT(GPTConfig(**fix["model"])))
engine.load_checkpoint(args.ckpt)
rank, world = dist.get_rank(), dist.get_world_size()
losses = []
for s in (fix["steps_before_save"], fix["steps_before_save"] + 1):
    tok, tgt = (torch.tensor(t) for t in fix["batches"][str(s)][rank])
    loss = engine(tok, tgt)
    engine.backward(loss)
    engine.step()
    t = loss.detach().clone()
    dist.all_reduce(t)
    losses.append(t.item() / world)
os.makedirs(args.out, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps({"losses": losses}))
