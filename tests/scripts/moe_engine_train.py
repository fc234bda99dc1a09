"""Rank script for the MoE engine tests: one launch trains the same tiny MoE model under several
(ep size, ZeRO stage) configurations in turn and writes rank 0's per-step losses to --out.

    dslaunch run --nproc-per-node 4 tests/scripts/moe_engine_train.py --out o.json
        --runs 1:0,2:1,4:2 [--steps 20] [--save-run 2:1 --save DIR --save-at 10]
        [--load-run 4:1:resumed --load DIR]

``--runs``: ``ep:stage[:label]`` (the label tells apart two runs of one configuration). Rank 0
also trains a plain single-process torch reference (all experts, the global batch, torch's AdamW
and clip_grad_norm_) written as ``reference``; ``--ref-state FILE``: its weights after
``--save-at`` steps (what a checkpoint saved then consolidates to).

The model: a linear embedding, two dslaunch.moe.layer.MoE layers (4 experts, top-1, dropless,
no random token selection: deterministic routing) with residuals, a head; cross entropy per
token. Every tensor starts from weights seeded by its name, every expert by its global id, so
any ep size holds the same model.
"""

import argparse
import json
import os
import sys
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dslaunch

HIDDEN, CLASSES, EXPERTS, TOKENS = 16, 5, 4, 4
GLOBAL_BATCH = 16  # sequences of TOKENS tokens per step, split over the ranks
CLIP = 0.3  # below every step's gradient norm: clipping acts at each step


def moe_layer(hidden, num_experts, ep_size):
    from dslaunch.moe.layer import MoE

    expert = nn.Linear(hidden, hidden)
    return MoE(hidden, expert, num_experts=num_experts, ep_size=ep_size, k=1,
               drop_tokens=False, use_rts=False)


class Net(nn.Module):
    def __init__(self, ep_size):
        super().__init__()
        self.embed = nn.Linear(8, HIDDEN)
        self.moe = nn.ModuleList(moe_layer(HIDDEN, EXPERTS, ep_size) for _ in range(2))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, y):
        h = self.embed(x)
        for m in self.moe:
            h = h + torch.tanh(m(h)[0])
        return nn.functional.cross_entropy(self.head(h).reshape(-1, CLASSES), y.reshape(-1))


def build(ep_size, ep_rank):
    """The same model for every ep size: each dense tensor seeded by its name, expert g of layer
    l from seed 1000 * (l + 1) + g."""
    torch.manual_seed(0)
    net = Net(ep_size)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if getattr(p, "allreduce", True):
                g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for li, m in enumerate(net.moe):
            experts = m.deepspeed_moe.experts.deepspeed_experts
            for i, e in enumerate(experts):
                g = torch.Generator().manual_seed(1000 * (li + 1) + ep_rank * len(experts) + i)
                for p in e.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, TOKENS, 8, generator=g)
    y = torch.randint(0, CLASSES, (GLOBAL_BATCH, TOKENS), generator=g)
    return x, y


def config(stage):
    return {"train_batch_size": GLOBAL_BATCH, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
            "gradient_clipping": CLIP, "steps_per_print": 1000,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500}}


def train(ep, stage, steps, save=None, save_at=-1, load=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    engine, *_ = dslaunch.initialize(model=build(ep, rank % ep), config=config(stage))
    start = 0
    if load:
        engine.load_checkpoint(load)
        start = engine.global_steps
    n = GLOBAL_BATCH // world
    losses, norms = [], []
    for step in range(start, steps):
        x, y = batch(step)
        loss = engine(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        norms.append(engine.get_global_grad_norm())
        if save and step + 1 == save_at:
            engine.save_checkpoint(save)
    engine.destroy()
    return {"losses": losses, "grad_norms": norms, "start": start}


def reference(steps, state_at=-1, state_file=None):
    net = build(1, 0)
    opt = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)
    losses, norms = [], []
    for step in range(steps):
        x, y = batch(step)
        loss = net(x, y)
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
        opt.step()
        losses.append(float(loss.detach()))
        if state_file and step + 1 == state_at:
            torch.save(net.state_dict(), state_file)
    return {"losses": losses, "grad_norms": norms}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", default="1:0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-run")
    ap.add_argument("--save")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--load-run")
    ap.add_argument("--load")
    ap.add_argument("--ref-state")
    a = ap.parse_args()
    dslaunch.init_distributed()
    out = {"world": dist.get_world_size(), "runs": {}}
    for run in a.runs.split(","):
        ep, stage = map(int, run.split(":")[:2])
        out["runs"][run] = train(ep, stage, a.steps,
                                 save=a.save if run == a.save_run else None, save_at=a.save_at,
                                 load=a.load if run == a.load_run else None)
    if dist.get_rank() == 0:
        out["reference"] = reference(a.steps, a.save_at, a.ref_state)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
