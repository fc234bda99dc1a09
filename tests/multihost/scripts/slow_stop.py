"""Attempt 0: rank 3 (host2) fails after the barrier while the other ranks are busy outside any
collective and take their whole grace period to stop (SIGTERM ignored, as a script that saves
on SIGTERM): rank 0 still holds MASTER_PORT's store when the launcher has already ended the
attempt (pdsh). Attempt 1: every rank succeeds."""
import os
import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
attempt = int(os.environ["DSLAUNCH_RESTART_COUNT"])
print(f"ATTEMPT {attempt} RANK {os.environ['RANK']}", flush=True)
if attempt == 0:
    if os.environ["RANK"] == "3":
        raise RuntimeError("first attempt fails on host2")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
dist.barrier()
dist.destroy_process_group()
