"""Rank script of bench_pipe.py: the BENCHMARKING GPT (examples/gpt.py bench_config(), 27.4M
params) as 8 layer specs (Embed, Block x 6, Head = final LayerNorm + linear) trained with a
pipeline engine's train_batch, under dslaunch (``--runtime dslaunch``, started by ``dslaunch
run``) or DeepSpeed (``--runtime deepspeed``, started by the peer venv's torchrun). Only torch and
examples/gpt.py are imported besides the runtime, so the same file runs in both venvs.

Writes --out/rank_{r}.json: step times (between barriers), CPU seconds per step (this rank's
process: a load-independent view of the work done), losses and, for dslaunch, the
per-instruction seconds of the pipeline executor, the activations held (count and bytes).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import Block, GPTConfig, TextBatches, bench_config, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--runtime", choices=["dslaunch", "deepspeed"], required=True)
p.add_argument("--out", required=True)
p.add_argument("--pp", type=int, default=2)
p.add_argument("--tp", type=int, default=1)
p.add_argument("--micro", type=int, default=1)
p.add_argument("--gas", type=int, default=4)
p.add_argument("--schedule", default="1f1b")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--measure-activations", action="store_true")
p.add_argument("--tiny", action="store_true", help="a 2-block d64 model (smoke test)")
args, _ = p.parse_known_args()

CFG = (GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=64) if args.tiny
       else bench_config())


class Embed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        nn.init.normal_(self.tok_emb.weight, std=0.02)

    def forward(self, tokens):
        return self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))


class PipeBlock(nn.Module):
    def __init__(self, cfg, tp_group=None):
        super().__init__()
        self.block = Block(cfg)
        if tp_group is not None:
            from dslaunch.engine.parallel.tp_plan import apply_tp_plan
            from gpt_tp import BLOCK_TP_PLAN
            apply_tp_plan(self.block, BLOCK_TP_PLAN, tp_group)

    def forward(self, x):
        return self.block(x)


class Head(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, x):
        return self.head(self.ln_f(x))


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def specs(LayerSpec, tp_group=None):
    return ([LayerSpec(Embed, CFG)] + [LayerSpec(PipeBlock, CFG, tp_group)
                                       for _ in range(CFG.n_layer)] + [LayerSpec(Head, CFG)])


def config():
    return {"train_micro_batch_size_per_gpu": args.micro,
            "gradient_accumulation_steps": args.gas,
            "steps_per_print": 1_000_000}


def adam(module):
    """The same torch Adam under both runtimes (no compiled optimizer op in the comparison)."""
    return torch.optim.Adam(module.parameters(), lr=1e-3)


torch.manual_seed(0)
if args.runtime == "dslaunch":
    import dslaunch
    from dslaunch.engine.parallel.topology import get_grid, make_topology
    from dslaunch.pipe import LayerSpec, PipelineModule

    dslaunch.init_distributed()
    grid = get_grid(make_topology(dist.get_world_size(), pipe=args.pp, model=args.tp))
    tp_group = grid.model_group if args.tp > 1 else None
    module = PipelineModule(specs(LayerSpec, tp_group), topology=grid.topology, loss_fn=loss_fn,
                            partition_method="parameters")
    cfg = dict(config(), dslaunch={"pipe_schedule": args.schedule})
    engine, _, _, _ = dslaunch.initialize(model=module, config=cfg, optimizer=adam(module))
    engine.measure_activations = args.measure_activations
    dp_rank, dp_world, stage = grid.dp_rank, grid.dp_world_size, grid.stage_id
else:
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule

    if args.tp != 1 or args.schedule != "1f1b":
        raise SystemExit("the DeepSpeed peer runs pipe x data layouts with its 1F1B schedule")
    deepspeed.init_distributed(dist_backend="gloo")
    module = PipelineModule(layers=specs(LayerSpec), num_stages=args.pp, loss_fn=loss_fn,
                            partition_method="parameters")
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=adam(module), config=config())
    dp_world = dist.get_world_size() // args.pp
    stage = engine.stage_id
    dp_rank = engine.grid.get_data_parallel_rank()

rank = dist.get_rank()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=CFG.seq_len,
                      global_batch=args.micro * args.gas * dp_world, seed=0)


def data(step):
    tok, tgt = batches.batch_at(step, dp_rank, dp_world)
    m = args.micro
    return iter([(tok[i * m:(i + 1) * m], tgt[i * m:(i + 1) * m]) for i in range(args.gas)])


times, cpus, losses = [], [], []
for step in range(args.warmup + args.steps):
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = engine.train_batch(data_iter=data(step))
    cpus.append(time.process_time() - c0)  # this rank's CPU seconds (all its threads)
    dist.barrier()
    times.append(time.perf_counter() - t0)
    losses.append(float(loss))
    if step + 1 == args.warmup and args.runtime == "dslaunch":
        engine.pipe_times.clear()  # instruction timings over the timed steps only

rec = {"runtime": args.runtime, "rank": rank, "stage": stage, "dp_rank": dp_rank,
       "times": times[args.warmup:], "cpu_s": cpus[args.warmup:], "losses": losses,
       "tokens_per_step": args.micro * args.gas * dp_world * CFG.seq_len,
       "params": sum(p.numel() for p in module.parameters()),
       "parts": [int(x) for x in module.parts]}  # DeepSpeed's may be numpy ints
if args.runtime == "dslaunch":
    rec["pipe_times"] = dict(engine.pipe_times)
    rec["peak_live_micro_batches"] = engine.peak_live_micro_batches
    rec["peak_activation_bytes"] = engine.peak_activation_bytes
    rec["p2p"] = engine.p2p.stats
Path(args.out).mkdir(parents=True, exist_ok=True)
(Path(args.out) / f"rank_{rank}.json").write_text(json.dumps(rec))
if os.environ.get("BENCH_PIPE_DESTROY", "1") == "1":
    dist.destroy_process_group()
