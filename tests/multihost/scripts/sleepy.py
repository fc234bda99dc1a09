"""All ranks meet, say READY, then sleep (a host is taken away meanwhile)."""
import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print("READY", os.environ["RANK"], flush=True)
time.sleep(300)
print("NOT STOPPED", os.environ["RANK"], flush=True)
