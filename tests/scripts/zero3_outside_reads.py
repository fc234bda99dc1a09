"""A model whose forwards read parameters outside their own modules, trained under ZeRO-3 (every
parameter partitioned: persistence threshold 0) or, with --reference, by plain PyTorch in one
process on the whole batch. The reads are the three kinds real models make:

- ``nn.MultiheadAttention`` passes ``out_proj.weight`` to ``F.linear`` without calling ``out_proj``;
- a parameter-less parent (``Mixer``) reads its child's weight and bias in its own forward;
- the root (no parameters of its own) reads the embedding's weight for a tied output head.

Each step's loss is the mean over the global batch (all-reduced over the ranks); an evaluation
forward under ``no_grad`` runs between steps 2 and 3. Then a forward-only stage-3 engine (no
optimizer: a frozen reference model, as TRL builds one) evaluates a fresh model. --out gets
``{"losses": {variant: [...]}, "eval": {variant: loss}, "frozen": loss}``.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ, BATCH, STEPS, LR = 64, 32, 8, 8, 6, 1e-2
CLIP = 1.0  # the engines' gradient_clipping: unset, DeepSpeed's default of 1.0

ZERO3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 4096}
VARIANTS = {  # name: zero_optimization
    "default": ZERO3,
    # no reuse, a small prefetch window: units released and gathered again around every use
    "tight": dict(ZERO3, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=1500,
                  stage3_max_live_parameters=6000),
}


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.inner = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(x @ self.inner.weight.t() + self.inner.bias)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attn = nn.MultiheadAttention(DIM, 2, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.mix = Mixer(DIM)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm(x + a)
        x = x + self.mix(x)
        logits = F.linear(x, self.embed.weight)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return tokens, (tokens * 3 + 1) % VOCAB  # a learnable map


def model():
    torch.manual_seed(0)
    return Net()


def reference():
    m = model()
    # the config's AdamW leaves weight_decay out: 0 in DeepSpeed (torch's AdamW default is 0.01)
    opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.0)
    losses, ev = [], None
    for step in range(STEPS):
        if step == 3:
            with torch.no_grad():
                m.eval()
                ev = m(*batch(99)).item()
                m.train()
        loss = m(*batch(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        frozen = model().eval()(*batch(99)).item()
    return {"losses": {v: losses for v in VARIANTS}, "eval": {v: ev for v in VARIANTS},
            "frozen": frozen}


def engine_runs():
    import dslaunch

    dslaunch.init_distributed()
    rank, world = dslaunch.comm.get_rank(), dslaunch.comm.get_world_size()
    per = BATCH // world

    def mine(step):
        tokens, targets = batch(step)
        return tokens[rank * per:(rank + 1) * per], targets[rank * per:(rank + 1) * per]

    def mean(loss):
        t = loss.detach().clone()
        dslaunch.comm.all_reduce(t)
        return t.item() / world

    out = {"losses": {}, "eval": {}}
    for name, zero in VARIANTS.items():
        m = model()
        engine, *_ = dslaunch.initialize(model=m, model_parameters=m.parameters(), config={
            "train_micro_batch_size_per_gpu": per, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}}, "zero_optimization": zero})
        losses = []
        for step in range(STEPS):
            if step == 3:
                with torch.no_grad():
                    engine.eval()
                    out["eval"][name] = mean(engine(*mine(99)))
                    engine.train()
            loss = engine(*mine(step))
            engine.backward(loss)
            engine.step()
            losses.append(mean(loss))
        out["losses"][name] = losses
        engine.destroy()
    m = model()
    frozen, *_ = dslaunch.initialize(model=m, config={
        "train_micro_batch_size_per_gpu": per, "zero_optimization": ZERO3})
    with torch.no_grad():
        frozen.eval()
        out["frozen"] = mean(frozen(*mine(99)))
    return out if rank == 0 else None


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    args = p.parse_args()
    result = reference() if args.reference else engine_runs()
    if result is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "ref.json" if args.reference else f"rank{os.environ.get('RANK', '0')}.json"
        (Path(args.out) / name).write_text(json.dumps(result))
