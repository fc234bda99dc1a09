"""Rank script of tests/test_pipe_universal.py: the layers of tests/scripts/pipe_model.py (untied)
as one plain nn.Sequential (names ``N.<param>``, as PipelineModule gives them), seeded per layer
as PipelineModule(seed_layers=True) seeds them, trained data-parallel through
dslaunch.initialize + engine(tokens) / backward / step (the config's ZeRO stage), the batches
pipe_train.py cuts. Saves after --save-at steps; writes --out/rank_{r}.json (losses)."""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pipe_model import layer_list, loss_fn, reference_model

import dslaunch
from gpt import TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--save-dir", required=True)
p.add_argument("--save-at", type=int, default=2)
args, _ = p.parse_known_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

dslaunch.init_distributed()
torch.manual_seed(0)
_, mods = reference_model(layer_list(), 1234)  # pipe_train.py's BASE_SEED
model = torch.nn.Sequential(*mods)
engine, _, _, _ = dslaunch.initialize(args=args, model=model)
rank, world = dist.get_rank(), dist.get_world_size()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=engine.train_batch_size(),
                      seed=0)
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
losses = []
for step in range(args.steps):
    tok, tgt = batches.batch_at(step, rank, world)
    total = torch.zeros(())
    for i in range(gas):
        loss = loss_fn(engine(tok[i * mb:(i + 1) * mb]), tgt[i * mb:(i + 1) * mb])
        engine.backward(loss)
        engine.step()
        total += loss.detach()
    total /= gas * world
    dist.all_reduce(total)
    losses.append(total.item())
    if step + 1 == args.save_at:
        engine.save_checkpoint(args.save_dir, client_state={"step": step + 1})
(out / f"rank_{rank}.json").write_text(json.dumps({"rank": rank, "losses": losses}))
