"""Rank script (4 ranks): DistributedAttention against full attention in fp64, on sequence groups
of 2 (ranks 0-1, 2-3) and 4 (every rank), both layouts, MHA and GQA/MQA-style head counts:
output and q/k/v gradients. Every rank builds the same full q, k, v (same seed) and keeps its
sequence shard. Then the loss over shards with ignored tokens, UlyssesSPDataLoaderAdapter, and
dslaunch.utils.groups on a sequence x data grid. Writes --out/rank_{r}.json: the largest error
of each case, the errors that indivisible head counts raise, what the adapter and the accessors
gave and what they should have."""

import argparse
import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dslaunch
from dslaunch.engine.parallel.groups import set_layout
from dslaunch.engine.parallel.topology import build_grid
from dslaunch.sequence.layer import DistributedAttention
from dslaunch.sequence.sharding import (
    IGNORE_INDEX,
    UlyssesSPDataLoaderAdapter,
    sequence_parallel_cross_entropy,
    shard_sequence,
)
from dslaunch.utils import groups as ugroups

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

# the loss over shards with ignored tokens (unevenly spread): the value is the whole sequence's
# mean, and each rank's logits gradient, averaged over the group as the engine averages the
# weights' gradients, is the whole sequence's
torch.manual_seed(7)
logits = torch.randn(2, 16, 11, dtype=torch.float64)
labels = torch.randint(0, 11, (2, 16))
labels[0, :6] = IGNORE_INDEX  # rank 0 of a group of 4 gets 2 x 4 tokens, 4 of them ignored
labels[1, 13:] = IGNORE_INDEX
full = logits.clone().requires_grad_(True)
ref = F.cross_entropy(full.reshape(-1, 11), labels.reshape(-1), ignore_index=IGNORE_INDEX)
ref.backward()
for sp in (2, 4):
    r = dist.get_rank(groups[sp])
    mine = shard_sequence(logits, r, sp).requires_grad_(True)
    loss = sequence_parallel_cross_entropy(mine, shard_sequence(labels, r, sp), groups[sp])
    loss.backward()
    res[f"loss_sp{sp}"] = abs(loss.item() - ref.item())
    res[f"loss_grad_sp{sp}"] = (mine.grad / sp - shard_sequence(full.grad, r, sp)).abs().max().item()

# the data-loader adapter: each rank of a pair draws its own batch; the pair then works through
# both, each rank on its half of the sequence, labels shifted before the split
pair, pr = groups[2], dist.get_rank(groups[2])
ids = torch.arange(8).reshape(1, 8) + 100 * rank
batches = [{"input_ids": ids, "position_ids": torch.arange(8).reshape(1, 8), "labels": ids,
            "note": f"from {rank}"}]
seen = list(UlyssesSPDataLoaderAdapter(batches, sp_rank=pr, sp_group=pair, sp_world_size=2,
                                       device="cpu"))
first = rank - pr  # the pair's lower global rank
res["adapter"] = [[b["input_ids"].tolist(), b["shift_labels"].tolist(), b["position_ids"].tolist(),
                   b["note"]] for b in seen]
res["adapter_expected"] = [
    [[[100 * g + 4 * pr + i for i in range(4)]],
     [[100 * g + 4 * pr + i + 1 if 4 * pr + i < 7 else IGNORE_INDEX for i in range(4)]],
     [[4 * pr + i for i in range(4)]], f"from {g}"] for g in (first, first + 1)]

# dslaunch.utils.groups through a sequence x data grid (data 2 x sequence 2)
grid = build_grid(sequence=2)
set_layout(grid)
res["groups"] = [ugroups._get_sequence_parallel_world_size(), ugroups._get_sequence_parallel_rank(),
                 ugroups._get_data_parallel_world_size(), ugroups._get_data_parallel_rank(),
                 ugroups._get_sequence_data_parallel_world_size(),
                 dist.get_process_group_ranks(ugroups._get_sequence_parallel_group())]
res["groups_expected"] = [2, rank % 2, 2, rank // 2, 4, [rank - rank % 2, rank - rank % 2 + 1]]

# tensor x sequence parallelism (model 2 x sequence 2): the groups of the grid and its mpu
tp_sp = build_grid(model=2, sequence=2)
res["tp_sp"] = [tp_sp.group_ranks["model"], tp_sp.group_ranks["sequence"],
                tp_sp.sequence_data_ranks, tp_sp.get_data_parallel_world_size(),
                tp_sp.get_sequence_data_parallel_world_size()]
res["tp_sp_expected"] = [[rank - rank % 2, rank - rank % 2 + 1], [rank % 2, rank % 2 + 2],
                         [rank % 2, rank % 2 + 2], 1, 2]

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank_{rank}.json").write_text(json.dumps(res))
# rank 0 hosts the store: it must not exit while the other ranks still build their last groups
# through it (non-members of a gloo group do not wait for its creation)
dist.barrier()
