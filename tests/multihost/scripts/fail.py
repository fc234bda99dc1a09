"""All ranks meet; rank 3 (on host2) raises, the others would sleep for minutes."""
import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print("READY", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "3":
    raise ValueError("boom on purpose from rank 3")
time.sleep(300)
print("NOT STOPPED", os.environ["RANK"], flush=True)
