"""Elastic training as a DeepSpeed script does it: engine.load_checkpoint(CKPT) at start (nothing
the first time), save_checkpoint every --save-every steps, on whatever world size this attempt
has. Rank 0 prints ``RESUMED <step> RESTART <n> WORLD <w>``, ``STEP ...``, ``SAVED <step>``.
The progress record is written here too (step, checkpoints), so the launcher's restart policy
and incident records see progress whether or not the engine fills those fields itself.

    elastic_train.py CKPT [--steps N] [--save-every K] [--sleep S] [--fail-rotating]

``--fail-rotating``: every attempt fails right after loading, on rank (restart count % world):
a crash loop that blames a different host each time.
"""
import argparse
import os
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dslaunch  # noqa: E402
from dslaunch import progress_record  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("ckpt")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--save-every", type=int, default=4)
ap.add_argument("--sleep", type=float, default=0.2)
ap.add_argument("--fail-rotating", action="store_true")
a = ap.parse_args()

restart = int(os.environ["DSLAUNCH_RESTART_COUNT"])
assert os.environ["TORCHELASTIC_RESTART_COUNT"] == str(restart)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
engine, *_ = dslaunch.initialize(model=model)
rank, world = dist.get_rank(), dist.get_world_size()
progress = progress_record.writer()
path, _ = engine.load_checkpoint(a.ckpt)
start = engine.global_steps
if progress is not None:
    progress.checkpoint_loaded(start if path else -1)
if rank == 0:
    print(f"RESUMED {start} RESTART {restart} WORLD {world}", flush=True)
if a.fail_rotating and rank == restart % world:
    raise RuntimeError(f"failing on purpose at restart {restart}")
for step in range(start, a.steps):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(4, 8, generator=g)
    loss = ((engine(x) - x.sum(1, keepdim=True)) ** 2).mean()
    engine.backward(loss)
    engine.step()
    if progress is not None:
        progress.step(engine.global_steps)
    if engine.global_steps % a.save_every == 0:
        engine.save_checkpoint(a.ckpt)
        if progress is not None:
            progress.checkpoint_saved(engine.global_steps)
        if rank == 0:
            print(f"SAVED {engine.global_steps}", flush=True)
    if rank == 0:
        print(f"STEP {engine.global_steps} WORLD {world} RESTART {restart}", flush=True)
    time.sleep(a.sleep)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(f"FINISHED {engine.global_steps} WORLD {world} RESTART {restart}", flush=True)
