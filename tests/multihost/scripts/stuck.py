"""All ranks do one all_reduce through dslaunch.comm; rank 3 (on host2) then sits in
wait_for_lock while the others wait in the next all_reduce (the hang watchdog's case)."""
import os
import time

import torch

import dslaunch.comm as dist


def wait_for_lock():
    while True:  # a lock nobody releases
        time.sleep(0.1)


dist.init_distributed(dist_backend="gloo")
t = torch.ones(2)
dist.all_reduce(t)
print("READY", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "3":
    wait_for_lock()
dist.all_reduce(t)
print("NOT STOPPED", os.environ["RANK"], flush=True)
