"""Trains the tiny GPT (examples/gpt.py) through dslaunch.initialize and writes, on rank 0, the
per-step losses plus what the stage-3 tests check:

- ``max_whole_numel``: the most parameter elements whose storage was allocated at once, seen from
  a forward pre/post hook on every module (stage 3 must stay below the model's numel);
- ``init``: with ``--init``, the model is built under ``dslaunch.zero.Init``; the per-rank
  parameter storage right after construction (bytes) and whether any parameter was whole;
- ``--modify K``: at step K, ``GatheredParameters(head.weight, modifier_rank=0)`` zeroes the
  first row of the output head on rank 0 (rank 1 writes garbage that must be discarded); the
  row's values after the next step are reported;
- ``peak_rss_mb``: ru_maxrss of each rank.

    dslaunch run --nproc-per-node 2 tests/scripts/zero3_train.py --config c.json -- --out o.json
"""

import argparse
import json
import resource
import sys
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
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--out", required=True)
ap.add_argument("--config", default=None)
ap.add_argument("--init", action="store_true")
ap.add_argument("--modify", type=int, default=-1)
ap.add_argument("--d-model", type=int, default=32)
ap.add_argument("--n-layer", type=int, default=2)
ap.add_argument("--bench-model", action="store_true", help="examples/gpt.py bench_config()")
ap.add_argument("--seq", type=int, default=32)
ap.add_argument("--save", default=None)
ap.add_argument("--load", default=None)
ap.add_argument("--save16", default=None, help="engine.save_16bit_model(DIR) at the end")
ap.add_argument("--external", action="store_true",
                help="tie the output head to the token embedding through a module that does not "
                     "own it (registered with zero.register_external_parameter)")
a, _ = ap.parse_known_args()

torch.manual_seed(0)
cfg = bench_config() if a.bench_model else GPTConfig(seq_len=a.seq, n_layer=a.n_layer, n_head=2,
                                                      d_model=a.d_model)
init_info = {}
if a.init:
    import os

    dslaunch.init_distributed()
    with dslaunch.zero.Init(config_dict_or_path=os.environ["DSLAUNCH_CONFIG"]):
        model = GPT(cfg)
    init_info = {
        "whole_params": sum(1 for p in model.parameters() if p.untyped_storage().nbytes() > 0),
        "shard_bytes": sum(p._dsl_shard.numel() * p._dsl_shard.element_size()
                           for p in model.parameters()),
        "numel": sum(p.numel() for p in model.parameters())}
else:
    model = GPT(cfg)
if a.external:
    class TiedHead(torch.nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.emb = [emb]  # a plain list: the embedding stays the other module's

        def forward(self, x):
            return torch.nn.functional.linear(x, self.emb[0].weight)

    model.head = TiedHead(model.tok_emb)
    dslaunch.zero.register_external_parameter(model.head, model.tok_emb.weight)
numel = sum(p.numel() for p in model.parameters())
engine, _, _, _ = dslaunch.initialize(model=model)
rank, world = dist.get_rank(), dist.get_world_size()
if a.load:
    engine.load_checkpoint(a.load)

max_whole = [0]


def count(*_):
    whole = sum(p.numel() for p in model.parameters() if p.untyped_storage().nbytes() > 0)
    max_whole[0] = max(max_whole[0], whole)


for m in model.modules():
    m.register_forward_pre_hook(count)
    m.register_forward_hook(count)

gas = engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 18), seq_len=cfg.seq_len, global_batch=8)
start = engine.global_steps
losses, modified = {}, None
for step in range(start, a.steps):
    if step == a.modify:
        with dslaunch.zero.GatheredParameters(model.head.weight, modifier_rank=0):
            with torch.no_grad():
                model.head.weight[0].fill_(0.0 if rank == 0 else 123.0)
        with dslaunch.zero.GatheredParameters(model.head.weight):
            modified = {"right_after": model.head.weight[0].float().abs().max().item()}
    tot = micro_steps(engine, batches, step, gas, rank, world)
    dist.all_reduce(tot)
    losses[step] = tot.item() / world
    if step == a.modify:
        with dslaunch.zero.GatheredParameters(model.head.weight):
            modified["after_step"] = model.head.weight[0].float().abs().max().item()
            modified["other_rows"] = model.head.weight[1:].float().abs().max().item()
if a.save:
    engine.save_checkpoint(a.save)
saved16 = engine.save_16bit_model(a.save16) if a.save16 else None
rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
rss_all = [torch.zeros(1) for _ in range(world)]
dist.all_gather(rss_all, rss)
if rank == 0:
    Path(a.out).write_text(json.dumps({
        "losses": losses, "numel": numel, "world": world, "memory": engine.memory_breakdown(),
        "max_whole_numel": max_whole[0], "init": init_info, "modified": modified,
        "max_live": getattr(getattr(engine.strategy, "store", None), "max_live", None),
        "comm": engine.comm_stats(), "peak_rss_mb": [float(t) for t in rss_all],
        "saved16": saved16}))
dist.barrier()
dist.destroy_process_group()
