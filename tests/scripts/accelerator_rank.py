"""Test rank: the accelerator under `dslaunch run`; init_distributed picks its backend itself."""
import os

import torch.distributed as dist

import dslaunch
from dslaunch.accelerator import get_accelerator

acc = get_accelerator()
acc.set_device(int(os.environ["LOCAL_RANK"]) % acc.device_count())
dslaunch.init_distributed()  # no backend named: the runtime chooses
t = acc.FloatTensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(f"accel rank={dist.get_rank()} kind={acc._name} backend={dist.get_backend()} "
      f"accel_backend={acc.communication_backend_name()} device_count={acc.device_count()} "
      f"device={acc.current_device_name()} sum={t.item():g}", flush=True)
dist.barrier()
