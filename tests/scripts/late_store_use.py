"""Rank script: rank 0 ends at once; the other ranks go on using the job's store after a pause
(``--pause`` seconds: a key set and read through the default group's store, then a group of
their own, whose gloo rendezvous goes through the store too). Under torchrun the agent hosts the
store, so this works; under a launcher whose rank 0 hosts it, rank 0's end must not take the
store away while the others still need it. Each rank writes --out/rank_<r>.json."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--pause", type=float, default=2.0)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
res = {"rank": rank, "sum": t.item()}
if rank != 0:
    time.sleep(args.pause)
    store = _get_default_store()
    store.set(f"late/{rank}", str(rank))
    res["read"] = store.get(f"late/{rank}").decode()
    group = dist.new_group(list(range(1, world)), use_local_synchronization=True)
    u = torch.ones(1)
    dist.all_reduce(u, group=group)
    res["late_sum"] = u.item()
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump(res, f)
