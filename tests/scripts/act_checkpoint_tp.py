"""Rank script: activation checkpointing over a 2-rank tensor-parallel group (gloo).

A block of dslaunch's tensor-parallel layers (column -> GELU -> dropout from the per-TP-rank
stream -> row -> dropout from the default generator, plus a residual) runs plainly and under
``dslaunch.checkpointing.checkpoint`` with every combination of partition_activations and
checkpoint_in_cpu; outputs and gradients must be bit-identical, and the saved bytes of the
checkpointed forward are this rank's slice of the block input. Also the model-parallel seeds of
``model_parallel_cuda_manual_seed``. Writes --out/rank_{r}.json.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dslaunch
from dslaunch.engine.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    get_rng_tracker,
    tp_manual_seed,
)
from dslaunch.engine.parallel.topology import build_grid

ck = dslaunch.checkpointing
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()

grid = build_grid(pipe=1, model=2)
rank = dist.get_rank()
res = {}


class TPBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = ColumnParallelLinear.from_linear(nn.Linear(d, 4 * d), grid.model_group)
        self.down = RowParallelLinear.from_linear(nn.Linear(4 * d, d), grid.model_group)

    def forward(self, x):
        h = F.gelu(self.up(self.ln(x)))
        with get_rng_tracker().fork():  # different on each tensor-parallel rank
            h = F.dropout(h, 0.3, training=True)
        return x + F.dropout(self.down(h), 0.2, training=True)  # the same on both ranks


torch.manual_seed(0)
blocks = nn.ModuleList(TPBlock(9) for _ in range(3)).double()


def run(use, x_in):
    torch.manual_seed(1)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
        x = x_in
        for b in blocks:
            x = ck.checkpoint(b, x) if use else b(x)
    for q in [x_in, *blocks.parameters()]:
        q.grad = None
    (x * torch.linspace(-1, 1, x.numel(), dtype=x.dtype).view_as(x)).sum().backward()
    grads = [x_in.grad.clone()] + [q.grad.clone() for q in blocks.parameters()]
    return x.detach(), grads, sum(saved), torch.rand(3)


# 108 elements per block input (halves of 54), and 27 (slices padded to 14)
for name, shape in (("even", (3, 4, 9)), ("odd", (1, 3, 9))):
    torch.manual_seed(2)
    x_in = torch.randn(*shape, dtype=torch.float64).requires_grad_(True)
    get_rng_tracker().states.clear()
    tp_manual_seed(7, grid.model_group)
    plain = run(False, x_in)
    for partition in (False, True):
        for cpu in (False, True):
            ck.configure(grid, partition_activations=partition, checkpoint_in_cpu=cpu)
            get_rng_tracker().states.clear()
            tp_manual_seed(7, grid.model_group)
            got = run(True, x_in)
            res[f"{name}_partition{int(partition)}_cpu{int(cpu)}"] = {
                "out_equal": torch.equal(plain[0], got[0]),
                "grads_equal": all(torch.equal(a, b) for a, b in zip(plain[1], got[1])),
                "rng_after_equal": torch.equal(plain[3], got[3]),
                "saved_bytes": got[2], "plain_saved_bytes": plain[2],
                "input_elements": x_in.numel(),
            }

# model_parallel_cuda_manual_seed: default generator equal on both ranks, tracker stream not
ck.configure(grid)
ck.model_parallel_cuda_manual_seed(1234)
default_draw = torch.rand(4)
with ck.get_cuda_rng_tracker().fork():
    tracked_draw = torch.rand(4)
both = [torch.zeros(8) for _ in range(2)]
dist.all_gather(both, torch.cat([default_draw, tracked_draw]))
res["default_same"] = torch.equal(both[0][:4], both[1][:4])
res["tracked_differs"] = not torch.equal(both[0][4:], both[1][4:])
res["mp_size"] = ck.mp_size
Path(args.out).mkdir(parents=True, exist_ok=True)
(Path(args.out) / f"rank_{rank}.json").write_text(json.dumps(res))
# rank 0 hosts the store: it must not exit while another rank may still use it (see ulysses_checks.py)
dist.barrier()
