"""A tiny language model trained with the config's Muon (tests/test_muon_zero.py).

    dslaunch run --nproc-per-node 2 tests/scripts/muon_train.py --config c.json -- --out o.json
    python tests/scripts/muon_train.py --reference --out o.json [--clip C] [--params JSON]
    ``--resume-at K --ckpt DIR``: save before step K, then a fresh engine (other initial
    weights) loads it and trains on: momentum and Adam states must come back.

The model's parameter names follow DeepSpeed's Muon rule: ``embed.weight`` and
``lm_head.weight`` (2-D) go to AdamW with the biases and the norm; the hidden matrices
(``hidden.N.weight``, one tall, one wide, one square) to Muon. Each global step takes 8
sequences; with R ranks and G accumulation micro-steps, micro-step m of rank r takes rows
[m*8/G + r*8/(G*R), ...) of them. ``--reference``: one process, no dslaunch engine, the whole
batch, ``clip_grad_norm_`` then ``dslaunch.engine.optim.muon.build_muon``'s optimizer (the
same Muon, stepping whole matrices). Writes {"losses": [...], "optimizer": ...} (rank 0).
"""

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VOCAB, DIM, SEQ, BATCH = 64, 24, 12, 8


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.hidden = torch.nn.ModuleList([torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(3 * DIM, DIM),
                                           torch.nn.Linear(DIM, DIM)])
        self.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        x = x + self.hidden[1](torch.nn.functional.gelu(self.hidden[0](x)))
        x = x + torch.tanh(self.hidden[2](x))
        logits = self.lm_head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def reference(a):
    from dslaunch.engine.optim.muon import build_muon

    torch.manual_seed(0)
    model = Tiny()
    params = json.loads(a.params)
    opt = build_muon(model.parameters(), params, model)
    losses = []
    for step in range(a.steps):
        tok, tgt = data(step)
        loss = model(tok, tgt)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    Path(a.out).write_text(json.dumps({"losses": losses, "optimizer": type(opt).__name__}))


def engine_run(a):
    import torch.distributed as dist

    import dslaunch

    torch.manual_seed(0)
    model = Tiny()
    engine, _, _, _ = dslaunch.initialize(model=model)
    rank, world = dist.get_rank(), dist.get_world_size()
    gas = engine.gradient_accumulation_steps()
    rows = BATCH // (gas * world)
    losses, norms = [], []
    for step in range(a.steps):
        if step == a.resume_at:  # save, then go on in a fresh engine on other weights
            engine.save_checkpoint(a.ckpt)
            engine.destroy()
            torch.manual_seed(1)
            model = Tiny()
            engine, _, _, _ = dslaunch.initialize(model=model)
            engine.load_checkpoint(a.ckpt)
        tok, tgt = data(step)
        tot = torch.zeros(1)
        for m in range(gas):
            lo = m * BATCH // gas + rank * rows
            loss = engine(tok[lo:lo + rows], tgt[lo:lo + rows])
            engine.backward(loss)
            engine.step()
            tot += loss.detach() / gas
        dist.all_reduce(tot)
        losses.append(tot.item() / world)
        norms.append(float(engine.get_global_grad_norm()))
    muon_groups = [g.get("name") for g in engine.optimizer.param_groups if g.get("use_muon")]
    split = 0  # Muon matrices with elements in more than one rank's chunk
    for g, pg in zip(getattr(engine.strategy, "groups", []), engine.optimizer.param_groups):
        for b in g.layout.buckets if pg.get("use_muon") else ():
            c = b.chunk(g.layout.world_size)
            split += sum(s.start // c != (s.start + s.numel - 1) // c for s in b.slots)
    if rank == 0:
        Path(a.out).write_text(json.dumps({
            "losses": losses, "optimizer": type(engine.optimizer).__name__, "grad_norms": norms,
            "muon_groups": muon_groups, "world": world, "split_matrices": split,
            "use_muon": {n: bool(getattr(p, "use_muon", None)) for n, p in model.named_parameters()},
            "comm": engine.comm_stats()}, default=str))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--params", default="{}", help="reference: the optimizer params (JSON)")
    ap.add_argument("--resume-at", type=int, default=-1,
                    help="engine: checkpoint before this step to --ckpt, resume in a new engine")
    ap.add_argument("--ckpt", default=None)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    reference(a) if a.reference else engine_run(a)
