"""A plain torch.distributed script (no dslaunch import): all ranks do one all_reduce; rank 3 (on
host2) then sleeps in wait_for_data while the others wait in the next all_reduce."""
import os
import time

import torch
import torch.distributed as dist


def wait_for_data():
    time.sleep(1e6)  # a data source that never answers


dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
print("READY", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "3":
    wait_for_data()
dist.all_reduce(t)
print("NOT STOPPED", os.environ["RANK"], flush=True)
