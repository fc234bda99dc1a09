"""Rank script: the 1-bit compressed all-reduce on known tensors, against an independent
reference (plain sign/scale arithmetic, no packing, no collectives), plus the error-feedback
drift over many calls. Writes --out/rank_{r}.json."""

import argparse
import json
import math
import os

import torch
import torch.distributed as dist

from dslaunch.engine.comm.collectives import Comm, init_distributed
from dslaunch.engine.optim.onebit.compressed import CompressedAllReduce

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=200)
args = p.parse_args()

init_distributed()
comm = Comm()
rank, world = comm.rank, comm.world_size


def inputs(step, numel, bias=0.0):
    """Every rank can compute every rank's input of a call."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(1000 * step + r)
        out.append(torch.randn(numel, generator=g) + bias * (r + 1))
    return out


def compress_ref(x, n_real):
    s = x.norm() / math.sqrt(n_real) if n_real > 0 else torch.tensor(0.0)
    return torch.where(x >= 0, s, -s)


class Reference:
    """The algorithm written out for all ranks at once (blocks of ``block`` values per scale)."""

    def __init__(self, numel, block):
        per_rank = -(-numel // world)
        per_rank = max(8, -(-per_rank // 8) * 8)
        self.block = min(block, per_rank)
        self.chunk = -(-per_rank // self.block) * self.block
        self.numel = numel
        self.padded = self.chunk * world
        self.werr = [torch.zeros(self.padded) for _ in range(world)]
        self.serr = [torch.zeros(self.chunk) for _ in range(world)]

    def comp(self, x, start):
        """Compress x (global positions start..) block by block."""
        out = []
        for b in range(0, len(x), self.block):
            n_real = min(max(self.numel - (start + b), 0), self.block)
            out.append(compress_ref(x[b:b + self.block], n_real))
        return torch.cat(out)

    def __call__(self, xs):
        c = self.chunk
        sent = []
        for r in range(world):
            x = torch.zeros(self.padded)
            x[:self.numel] = xs[r]
            x += self.werr[r]
            comp = self.comp(x, 0)
            self.werr[r] = x - comp
            self.werr[r][self.numel:] = 0
            sent.append(comp)
        outs = []
        for j in range(world):
            valid = min(max(self.numel - j * c, 0), c)
            avg = sum(sent[r][j * c:(j + 1) * c] for r in range(world)) / world + self.serr[j]
            avg[valid:] = 0
            comp = self.comp(avg, j * c)
            self.serr[j] = avg - comp
            self.serr[j][valid:] = 0
            outs.append(comp)
        return torch.cat(outs)[:self.numel]


rec = {"rank": rank, "world": world, "exact": {}, "drift": {}}
for numel, block in ((37, 2048), (1000, 2048), (4099, 2048), (4099, 64), (5000, 8)):
    car = CompressedAllReduce(numel, comm=comm, block_size=block)
    ref = Reference(numel, block)
    worst = 0.0
    for step in range(5):
        xs = inputs(step, numel)
        got = xs[rank].clone()
        car(got)
        want = ref(xs)
        worst = max(worst, (got - want).abs().max().item())
    mags = got.abs()
    per_block = [len(torch.unique(mags[i:i + car.block].round(decimals=5)))
                 for i in range(0, numel, car.block)]
    rec["exact"][f"{numel}/{block}"] = {
        "max_abs_diff": worst, "one_magnitude_per_block": max(per_block) == 1,
        "bytes_per_call": car.bytes_per_call, "padded": car.padded, "blocks": car.blocks,
        "calls_booked": comm.stats()["onebit_all_to_all"]["calls"] if world > 1 else 0}

# error feedback: running sum of the compressed averages vs the running sum of the true averages
numel = 1000
with_fb = CompressedAllReduce(numel, comm=comm)
no_fb = CompressedAllReduce(numel, comm=comm)
true_sum = torch.zeros(numel)
fb_sum = torch.zeros(numel)
nofb_sum = torch.zeros(numel)
curve = []
for step in range(args.iters):
    xs = inputs(10_000 + step, numel, bias=0.3)
    true_sum += sum(xs) / world
    a = xs[rank].clone()
    fb_sum += with_fb(a)
    b = xs[rank].clone()
    no_fb.reset_errors()
    nofb_sum += no_fb(b)
    if (step + 1) % 25 == 0:
        curve.append({"step": step + 1,
                      "feedback": (fb_sum - true_sum).norm().item() / math.sqrt(numel),
                      "no_feedback": (nofb_sum - true_sum).norm().item() / math.sqrt(numel),
                      "true_rms": true_sum.norm().item() / math.sqrt(numel)})
rec["drift"] = curve
stats = comm.stats()
rec["comm_stats"] = stats
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump(rec, f)
dist.destroy_process_group()
