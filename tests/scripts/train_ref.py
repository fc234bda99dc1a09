"""Single-process plain-PyTorch reference for the engine tests (no dslaunch import): same tiny
GPT, same data, AdamW (fused, as the engine builds it) + clip_grad_norm_, one step per global
batch. Writes --out/ref.json with the per-step losses and the final weights."""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--weight-decay", type=float, default=0.01)
p.add_argument("--clip", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(args.seed)
model = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, fused=True)
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=args.batch, seed=args.seed)
losses = []
for step in range(args.steps):
    tokens, targets = batches.batch_at(step)
    loss = model(tokens, targets)
    loss.backward()
    if args.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
os.makedirs(args.out, exist_ok=True)
Path(args.out, "ref.json").write_text(json.dumps({"losses": losses}))
torch.save({k: v.detach() for k, v in model.state_dict().items()}, Path(args.out, "ref_final.pt"))
