"""Test rank for the hang watchdog: ``hang_rank.py MODE RANK [STEPS]`` through dslaunch.comm.

- ``stuck R``: every rank does all_reduce #1 on the world; rank R then sits in ``wait_for_lock``
  (never returns) while the others wait in all_reduce #2.
- ``desync R``: rank R calls all_gather where the others call reduce_scatter (collective #2).
- ``slow R STEPS``: STEPS steps of about a second of computation each, then an all_reduce; no
  hang (R unused).
"""

import sys
import time

import torch

import dslaunch.comm as dist

dist.init_distributed(dist_backend="gloo")
mode, odd = sys.argv[1], int(sys.argv[2])
rank, world = dist.get_rank(), dist.get_world_size()


def wait_for_lock():
    while True:  # a lock nobody releases
        time.sleep(0.1)


def compute():
    time.sleep(1.0)


t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank} ready", flush=True)
if mode == "stuck":
    if rank == odd:
        wait_for_lock()
    dist.all_reduce(t)
elif mode == "desync":
    if rank == odd:
        dist.all_gather_into_tensor(torch.zeros(4 * world), torch.ones(4))
    else:
        dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))
elif mode == "slow":
    for _ in range(int(sys.argv[3])):
        compute()
        dist.all_reduce(t)
    print(f"rank {rank} done", flush=True)
