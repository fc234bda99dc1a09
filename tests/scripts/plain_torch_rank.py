"""A plain torch.distributed script (no dslaunch import) for the hang watchdog:
``plain_torch_rank.py MODE RANK [SECONDS]``.

- ``stuck R``: every rank does all_reduce #1; rank R then sits in ``wait_for_data`` (alive,
  asleep, never returns) while the others wait in all_reduce #2.
- ``desync R``: rank R calls all_gather_into_tensor where the others call reduce_scatter_tensor
  (collective #2 on the world).
- ``async R``: rank R sits in ``wait_for_data`` before its isend; the others wait in
  ``work.wait()`` of an async all_reduce.
- ``compute R SECONDS``: fault-free: rank R computes (busy, no collective) for SECONDS while the
  others wait in a barrier, then every rank does a few more collectives and prints "done".
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
mode, odd = sys.argv[1], int(sys.argv[2])
rank, world = dist.get_rank(), dist.get_world_size()


def wait_for_data():
    time.sleep(1e6)  # a data source that never answers


def compute(seconds):
    x = torch.rand(96, 96)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.tanh(x @ x)
    return x


t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank} ready pid {os.getpid()}", flush=True)
if mode == "stuck":
    if rank == odd:
        wait_for_data()
    dist.all_reduce(t)
elif mode == "desync":
    if rank == odd:
        dist.all_gather_into_tensor(torch.zeros(4 * world), torch.ones(4))
    else:
        dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))
elif mode == "async":
    if rank == odd:
        wait_for_data()
    dist.all_reduce(t, async_op=True).wait()
elif mode == "compute":
    if rank == odd:
        compute(float(sys.argv[3]))
    dist.barrier()
    for _ in range(3):
        dist.all_reduce(t)
        dist.all_gather_object([None] * world, {"rank": rank})
    print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
