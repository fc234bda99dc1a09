"""Rank script: each tensor-parallel layer against the full layer it was sliced from (forward
and gradients), the vocab-parallel cross-entropy against F.cross_entropy, and the per-TP-rank
dropout RNG. Every rank builds the same full layers (same seed). Writes --out/rank_{r}.json."""

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
    VocabParallelEmbedding,
    get_rng_tracker,
    tp_manual_seed,
    vocab_parallel_cross_entropy,
)
from dslaunch.engine.parallel.topology import build_grid

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()

dslaunch.init_distributed()
grid = build_grid(pipe=1, model=dist.get_world_size())
g, r, w = grid.model_group, grid.tp_rank, grid.tp_world_size
torch.manual_seed(0)
res = {}


def err(a, b):
    return (a - b).abs().max().item()


# column-parallel, output gathered
full = nn.Linear(8, 12)
col = ColumnParallelLinear.from_linear(full, g, gather_output=True)
x = torch.randn(3, 5, 8, requires_grad=True)
x2 = x.detach().clone().requires_grad_(True)
up = torch.randn(3, 5, 12)
(col(x) * up).sum().backward()
(full(x2) * up).sum().backward()
rows = slice(r * 12 // w, (r + 1) * 12 // w)
res["col_out"] = err(col(x), full(x2))
res["col_dx"] = err(x.grad, x2.grad)
res["col_dw"] = err(col.weight.grad, full.weight.grad[rows])
res["col_db"] = err(col.bias.grad, full.bias.grad[rows])
res["col_shape"] = list(col.weight.shape)

# row-parallel, input split inside
full = nn.Linear(12, 8)
row = RowParallelLinear.from_linear(full, g, input_is_parallel=False)
x = torch.randn(3, 5, 12, requires_grad=True)
x2 = x.detach().clone().requires_grad_(True)
up = torch.randn(3, 5, 8)
(row(x) * up).sum().backward()
(full(x2) * up).sum().backward()
res["row_out"] = err(row(x), full(x2))
res["row_dx"] = err(x.grad, x2.grad)
res["row_dw"] = err(row.weight.grad, full.weight.grad[:, r * 12 // w:(r + 1) * 12 // w])
res["row_db"] = err(row.bias.grad, full.bias.grad)

# vocab-parallel embedding
full = nn.Embedding(16, 8)
emb = VocabParallelEmbedding.from_embedding(full, g)
tok = torch.randint(0, 16, (4, 6))
up = torch.randn(4, 6, 8)
(emb(tok) * up).sum().backward()
(full(tok) * up).sum().backward()
res["emb_out"] = err(emb(tok), full(tok))
res["emb_dw"] = err(emb.weight.grad, full.weight.grad[r * 16 // w:(r + 1) * 16 // w])

# vocab-parallel cross-entropy
logits = torch.randn(10, 16) * 3
target = torch.randint(0, 16, (10,))
full_l = logits.clone().requires_grad_(True)
local = logits[:, r * 16 // w:(r + 1) * 16 // w].clone().requires_grad_(True)
loss = vocab_parallel_cross_entropy(local, target, g).mean()
loss.backward()
ref = F.cross_entropy(full_l, target)
ref.backward()
res["ce_loss"] = abs(loss.item() - ref.item())
res["ce_grad"] = err(local.grad, full_l.grad[:, r * 16 // w:(r + 1) * 16 // w])

# RNG: same default stream on TP peers, a different stream per TP rank inside fork()
tp_manual_seed(123, g)
outside = F.dropout(torch.ones(64), 0.5)
with get_rng_tracker().fork():
    inside1 = F.dropout(torch.ones(64), 0.5)
with get_rng_tracker().fork():
    inside2 = F.dropout(torch.ones(64), 0.5)
after = F.dropout(torch.ones(64), 0.5)
torch.manual_seed(123)
F.dropout(torch.ones(64), 0.5)
after_plain = F.dropout(torch.ones(64), 0.5)
gathered = [torch.empty(4, 64) for _ in range(w)]
dist.all_gather(gathered, torch.stack([outside, inside1, inside2, after]), group=g)
res["rng_outside_same"] = all(torch.equal(t[0], gathered[0][0]) for t in gathered)
res["rng_inside_differ"] = not torch.equal(gathered[0][1], gathered[1][1])
res["rng_fork_advances"] = not torch.equal(inside1, inside2)
res["rng_default_untouched"] = torch.equal(after, after_plain)
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{dist.get_rank()}.json").write_text(json.dumps(res))
# rank 0 hosts the store: it must not exit while another rank may still use it (see ulysses_checks.py)
dist.barrier()
