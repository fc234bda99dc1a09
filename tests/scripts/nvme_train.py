"""Trains the example GPT through dslaunch.initialize (config from the launcher) and writes, on
rank 0, per-step losses, step times, every rank's memory_breakdown(), peak RSS and (with NVMe
offload of the optimizer states or the parameters) swap statistics and the swap files seen during
training, as JSON.

    dslaunch run --nproc-per-node 2 tests/scripts/nvme_train.py --config c.json --
        --steps 6 --out o.json [--save DIR --save-at K] [--load DIR] [--fail-at K]
        [--d-model 32 --n-layer 2 --vocab 256 --seq 32 --batch 8] [--bench]

``--bench`` uses examples/gpt.py's bench_config (27.4M parameters).
"""

import argparse
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from train_steps import micro_steps  # noqa: E402

import dslaunch  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, bench_config, stdlib_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--out", required=True)
ap.add_argument("--save", default=None)
ap.add_argument("--save-at", type=int, default=-1)
ap.add_argument("--load", default=None)
ap.add_argument("--d-model", type=int, default=32)
ap.add_argument("--n-layer", type=int, default=2)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--seq", type=int, default=32)
ap.add_argument("--batch", type=int, default=8, help="global batch of the data stream")
ap.add_argument("--bench", action="store_true")
ap.add_argument("--warmup", type=int, default=0,
                help="also report swap statistics counted after this many steps")
ap.add_argument("--fail-at", type=int, default=-1, help="rank 1 raises after this many steps")
a = ap.parse_args()


def swap_files(engine):
    """The files under this rank's swap directories right now (NVMe offload only): the
    optimizer's and the parameter store's."""
    dirs = [getattr(engine.optimizer, "swap_dir", None),
            getattr(getattr(engine.strategy, "store", None), "swap_dir", None)]
    dirs = [d for d in dirs if d is not None]
    if not dirs:
        return None
    return {f: os.path.getsize(os.path.join(d, f)) for d in dirs for f in os.listdir(d)}


def param_swap_stats(engine):
    store = getattr(engine.strategy, "store", None)
    return store.swap_stats() if hasattr(store, "swap_stats") else None


torch.manual_seed(0)
cfg = bench_config() if a.bench else GPTConfig(vocab_size=a.vocab, seq_len=a.seq,
                                                n_layer=a.n_layer, n_head=2, d_model=a.d_model)
model = GPT(cfg)
engine, _, _, _ = dslaunch.initialize(model=model)
rank, world = dist.get_rank(), dist.get_world_size()
gas = engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=cfg.seq_len, global_batch=a.batch,
                      vocab_size=cfg.vocab_size) if a.bench else \
    TextBatches(stdlib_bytes(1 << 18), seq_len=cfg.seq_len, global_batch=a.batch)
start = 0
if a.load:
    engine.load_checkpoint(a.load)
    start = engine.global_steps
losses, times, files, warm = {}, {}, None, None
for step in range(start, a.steps):
    t0 = time.perf_counter()
    tot = micro_steps(engine, batches, step, gas, rank, world)
    times[step] = time.perf_counter() - t0
    dist.all_reduce(tot)
    losses[step] = tot.item() / world
    files = swap_files(engine) if files is None else files
    if step + 1 == a.warmup and hasattr(engine.optimizer, "swap_stats"):
        warm = engine.optimizer.swap_stats()
    if step + 1 == a.fail_at and rank == 1:
        raise RuntimeError("planned failure")
    if step + 1 == a.save_at and a.save:
        engine.save_checkpoint(a.save)
stats = engine.optimizer.swap_stats() if hasattr(engine.optimizer, "swap_stats") else None
if stats and warm:  # what the steps after the warm-up moved and took
    stats["after_warmup"] = {k: v - warm[k] for k, v in stats.items()
                             if isinstance(v, (int, float)) and k in warm}
mine = {"rank": rank, "memory": engine.memory_breakdown(),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "swap": stats, "swap_files": files, "param_swap": param_swap_stats(engine)}
every = [None] * world
dist.all_gather_object(every, mine)
if rank == 0:
    Path(a.out).write_text(json.dumps({
        "losses": losses, "step_seconds": times, "numel": model.num_params(), "world": world,
        "optimizer": type(engine.optimizer).__name__, "ranks": every}))
dist.barrier()
dist.destroy_process_group()
