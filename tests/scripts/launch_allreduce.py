"""Test rank: a real gloo process group from env://, one all_reduce, result printed."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"allreduce rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
