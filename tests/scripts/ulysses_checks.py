"""Rank script (4 ranks): DistributedAttention against full attention in fp64, on sequence groups
of 2 (ranks 0-1, 2-3) and 4 (every rank), both layouts, MHA and GQA/MQA-style head counts:
output and q/k/v gradients. Every rank builds the same full q, k, v (same seed) and keeps its
sequence shard. Writes --out/rank_{r}.json: the largest error of each case, and the errors that
indivisible head counts raise."""

import argparse
import json
import math
from pathlib import Path

import torch
import torch.distributed as dist

import dslaunch
from dslaunch.sequence.layer import DistributedAttention

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()

dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
groups = {2: pairs[rank // 2], 4: dist.group.WORLD}


def attention(q, k, v, layout):
    """Causal softmax attention with grouped key/value heads, in the given layout."""
    if layout == 1:  # [s, b, h, d] -> [b, s, h, d]
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2)  # [b, s, h, d]
    return out.transpose(0, 1) if layout == 1 else out


def case(sp, layout, heads, kv_heads):
    """The largest error of output and q/k/v gradients against full attention."""
    group = groups[sp]
    r = dist.get_rank(group)
    torch.manual_seed(1000 * sp + 100 * layout + kv_heads)
    b, s, d = 2, 16, 4
    seq_dim = 1 - layout

    def shape(h):
        return (b, s, h, d) if layout == 0 else (s, b, h, d)

    def shard(t):
        return t.chunk(sp, dim=seq_dim)[r]

    full = [torch.randn(shape(h), dtype=torch.float64) for h in (heads, kv_heads, kv_heads)]
    up = torch.randn(shape(heads), dtype=torch.float64)
    ref_in = [t.clone().requires_grad_(True) for t in full]
    ref = attention(*ref_in, layout)
    (ref * up).sum().backward()
    local = [shard(t).clone().requires_grad_(True) for t in full]
    dist_attn = DistributedAttention(attention, group)
    out = dist_attn(*local, layout, None, layout)  # local_attention(q, k, v, layout)
    (out * shard(up)).sum().backward()
    errs = [(out - shard(ref)).abs().max().item()]
    errs += [(x.grad - shard(y.grad)).abs().max().item() for x, y in zip(local, ref_in)]
    return max(errs)


res = {}
for sp in (2, 4):
    for layout in (0, 1):
        for heads, kv_heads in ((8, 8), (8, 4), (8, sp)):
            res[f"sp{sp}_layout{layout}_h{heads}_kv{kv_heads}"] = case(sp, layout, heads, kv_heads)

# heads that the group size does not divide: a clear error before any exchange
for heads, kv in ((6, 6), (8, 2)):
    q = torch.randn(2, 4, heads, 4, dtype=torch.float64)
    k = torch.randn(2, 4, kv, 4, dtype=torch.float64)
    try:
        DistributedAttention(lambda q, k, v: q, groups[4])(q, k, k, 0)
        res[f"error_h{heads}_kv{kv}"] = None
    except ValueError as e:
        res[f"error_h{heads}_kv{kv}"] = str(e)

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank_{rank}.json").write_text(json.dumps(res))
