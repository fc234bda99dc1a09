"""Attempt 0: rank 3 (host2) fails after the barrier. Later attempts: every rank succeeds."""
import os

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
attempt = int(os.environ["DSLAUNCH_RESTART_COUNT"])
print(f"ATTEMPT {attempt} RANK {os.environ['RANK']}", flush=True)
if attempt == 0 and os.environ["RANK"] == "3":
    raise RuntimeError("first attempt fails on host2")
dist.barrier()
dist.destroy_process_group()
