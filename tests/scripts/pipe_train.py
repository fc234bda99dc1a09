"""Rank script for the pipeline / tensor-parallel tests, and (``--reference``) the plain
single-process PyTorch run they are compared with.

--model pipe: the tiny GPT as PipelineModule layers (tests/scripts/pipe_model.py) on a
  pipe x data x model grid, trained with engine.train_batch(data_iter); TP splits every Block
  (and, with --vocab-parallel, the head + vocab-parallel cross-entropy).
--model gpt: examples/gpt.py's GPT split by examples/gpt_tp.py's GPT_TP_PLAN (vocab-parallel
  embedding and head), trained through dslaunch.initialize(mpu=grid) and engine(tokens, targets).
Data: TextBatches(global batch = train_batch_size).batch_at(step, dp_rank, dp_world), cut into
the micro-batches in order, so every layout sees the rows of one process's batch.
Writes --out/rank_{r}.json (or ref.json).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pipe_model import CFG, layer_list, loss_fn, pipe_specs, reference_model

from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--model", choices=["pipe", "gpt"], default="pipe")
p.add_argument("--reference", action="store_true")
p.add_argument("--pp", type=int, default=1)
p.add_argument("--tp", type=int, default=1)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--batch", type=int, default=8, help="reference: global batch")
p.add_argument("--tied", action="store_true")
p.add_argument("--vocab-parallel", action="store_true")
p.add_argument("--blocks", type=int, default=2)
p.add_argument("--partition", default="parameters")
p.add_argument("--ckpt-interval", type=int, default=0)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--save-dir")
p.add_argument("--save-at", type=int, default=-1)
p.add_argument("--load-dir")
p.add_argument("--varying-seq", action="store_true", help="sequence length changes per step")
p.add_argument("--clip", type=float, default=0.0, help="reference: clip_grad_norm_ to this")
p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
               help="reference: bf16 weights + fp32 masters (the engine's mixed precision)")
args, _ = p.parse_known_args()

BASE_SEED = 1234
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)


def seq_len(step):
    return CFG.seq_len - (step % 3) * 4 if args.varying_seq else CFG.seq_len


def batch_at(batches, step, rank, world):
    tok, tgt = batches.batch_at(step, rank, world)
    n = seq_len(step)
    return tok[:, :n].contiguous(), tgt[:, :n].contiguous()


if args.reference:
    torch.manual_seed(args.seed)
    if args.model == "gpt":
        model = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
        params = list(model.parameters())
        forward = None
    else:
        forward, mods = reference_model(layer_list(tied=args.tied, n_blocks=args.blocks),
                                        BASE_SEED)
        params = list(mods.parameters())
    masters = params
    if args.dtype == "bf16":  # low-precision weights, fp32 masters stepped by the optimizer
        for t in params:
            t.data = t.data.to(torch.bfloat16)
        masters = [t.detach().float().requires_grad_(True) for t in params]
    opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01, fused=True)
    batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=args.batch,
                          seed=args.seed)
    losses, norms = [], []
    for step in range(args.steps):
        tok, tgt = batch_at(batches, step, 0, 1)
        loss = model(tok, tgt) if args.model == "gpt" else loss_fn(forward(tok), tgt)
        loss.backward()
        if masters is not params:
            for m, t in zip(masters, params):
                m.grad = t.grad.float()
                t.grad = None
        if args.clip > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(masters, args.clip).item())
        opt.step()
        opt.zero_grad()
        if masters is not params:
            with torch.no_grad():
                for m, t in zip(masters, params):
                    t.copy_(m)
        losses.append(loss.item())
    (out / "ref.json").write_text(json.dumps({"losses": losses, "norms": norms}))
    sys.exit(0)

import torch.distributed as dist  # noqa: E402

import dslaunch  # noqa: E402
from dslaunch.engine.parallel.tensor_parallel import vocab_parallel_cross_entropy  # noqa: E402
from dslaunch.engine.parallel.topology import get_grid, make_topology  # noqa: E402
from dslaunch.engine.parallel.tp_plan import apply_tp_plan  # noqa: E402
from dslaunch.pipe import PipelineModule  # noqa: E402
from gpt_tp import GPT_TP_PLAN  # noqa: E402

dslaunch.init_distributed()
torch.manual_seed(args.seed)
grid = get_grid(make_topology(dist.get_world_size(), pipe=args.pp, model=args.tp))
tp_group = grid.model_group if args.tp > 1 else None
rec = {"rank": dist.get_rank(), "stage": grid.stage_id, "dp_rank": grid.dp_rank,
       "tp_rank": grid.tp_rank, "coord": list(grid.coord), "losses": []}

if args.model == "gpt":
    model = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
    apply_tp_plan(model, GPT_TP_PLAN, tp_group)
    engine, _, _, _ = dslaunch.initialize(args=args, model=model, mpu=grid)
else:
    vocab_group = tp_group if args.vocab_parallel else None
    specs = layer_list(tied=args.tied, tp_group=tp_group, n_blocks=args.blocks,
                       vocab_group=vocab_group)
    lf = loss_fn
    if args.vocab_parallel:
        def lf(logits, targets):
            return vocab_parallel_cross_entropy(logits, targets, tp_group).mean()
    module = PipelineModule(pipe_specs(specs), topology=grid.topology, loss_fn=lf,
                            seed_layers=True, base_seed=BASE_SEED,
                            partition_method=args.partition,
                            activation_checkpoint_interval=args.ckpt_interval)
    rec["parts"] = module.parts
    rec["local_params"] = sum(p.numel() for p in module.parameters())
    engine, _, _, _ = dslaunch.initialize(args=args, model=module)

from dslaunch.utils import groups  # noqa: E402  (what DeepSpeed's groups accessors answer here)

rec["groups"] = {axis: {"world_size": getattr(groups, f"_get_{axis}_world_size")(),
                        "rank": getattr(groups, f"_get_{axis}_rank")(),
                        "ranks": dist.get_process_group_ranks(getattr(groups,
                                                                      f"_get_{axis}_group")())}
                 for axis in ("data_parallel", "model_parallel", "pipe_parallel",
                              "sequence_parallel")}
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=engine.train_batch_size(),
                      seed=args.seed)
start = 0
if args.load_dir:
    _, client = engine.load_checkpoint(args.load_dir)
    start = engine.global_steps
    rec["client_state"] = client
rec["start"] = start
for step in range(start, args.steps):
    tok, tgt = batch_at(batches, step, grid.dp_rank, grid.dp_world_size)
    if args.model == "gpt":
        total = torch.zeros(())
        for i in range(gas):
            loss = engine(tok[i * mb:(i + 1) * mb], tgt[i * mb:(i + 1) * mb])
            total += loss.detach()
            engine.backward(loss)
            engine.step()
        rec.setdefault("norms", []).append(engine.get_global_grad_norm())
        mean = total / gas
        dist.all_reduce(mean, group=grid.data_group)
        rec["losses"].append(mean.item() / grid.dp_world_size)
    else:
        it = iter([(tok[i * mb:(i + 1) * mb], tgt[i * mb:(i + 1) * mb]) for i in range(gas)])
        loss = engine.train_batch(it)
        rec["losses"].append(loss.item())
        rec.setdefault("norms", []).append(engine.get_global_grad_norm())
        if args.save_dir and step + 1 == args.save_at:
            engine.save_checkpoint(args.save_dir, client_state={"step": step + 1})
if args.model == "pipe":
    it = iter([(tok[i * mb:(i + 1) * mb], tgt[i * mb:(i + 1) * mb]) for i in range(gas)])
    rec["eval_loss"] = engine.eval_batch(it).item()
    rec["p2p"] = engine.p2p.stats
    rec["peak_live"] = engine.peak_live_micro_batches
    rec["schedule"] = engine.pipe_schedule
rec["global_steps"] = engine.global_steps
rec["skipped_steps"], rec["loss_scale"] = engine.skipped_steps, engine.loss_scale
rec["dtype"] = engine.precision.name
if args.save_dir and args.save_at == args.steps:  # saved after the last step: the eval's weights
    rec["eval_batches"] = [[t.tolist() for t in (tok[i * mb:(i + 1) * mb],
                                                 tgt[i * mb:(i + 1) * mb])] for i in range(gas)]
rec["comm"] = engine.comm_stats()
(out / f"rank_{dist.get_rank()}.json").write_text(json.dumps(rec))
