"""Curriculum data sampling vs uniform sampling: validation loss against training tokens seen.

A small GPT (examples/gpt.py: 2 layers, d_model 64) learns a synthetic language: a fixed random
Markov chain where each token has 3 possible successors (the best achievable loss is about
ln 3 = 1.10 nats per token). Sample i is a walk of 8..64 tokens; its difficulty metric is its
length, computed offline by dslaunch's ``DataAnalyzer``. Two runs with the same model init, batch
size, optimizer and number of steps:

- ``curriculum``: ``DeepSpeedDataSampler``, ``seqlen`` from 8 to 64 over the first half of the
  steps (``fixed_linear``, multiples of 8), then every sample;
- ``uniform``: samples drawn uniformly at random (with replacement, seeded).

Every --eval-every steps: the mean loss on 256 held-out full-length (64-token) walks. Tokens seen
count the real (unpadded) target tokens trained on. The Data Efficiency paper (Li et al. 2022)
claims the same quality with less data; the JSON says how many tokens each run needed to reach
the uniform run's final validation loss.

    python benchmarks/bench_data_efficiency.py [--steps 400] [--seeds 2]

Writes benchmarks/results/data_efficiency-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from dslaunch.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer  # noqa: E402
from dslaunch.runtime.data_pipeline.data_sampling.data_sampler import (  # noqa: E402
    DeepSpeedDataSampler,
)
from gpt import GPT, GPTConfig  # noqa: E402

VOCAB, SEQ, PAD = 64, 64, -100


def successor_table(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(VOCAB, 3, replace=False) for _ in range(VOCAB)])


class Walks(torch.utils.data.Dataset):
    """Sample i: a walk on the chain, ``length(i)`` + 1 tokens, as (tokens, targets) padded to SEQ."""

    def __init__(self, count: int, table: np.ndarray, offset: int = 0, full: bool = False):
        self.count, self.table, self.offset, self.full = count, table, offset, full

    def length(self, i: int) -> int:
        return SEQ if self.full else 8 + (i * 7919 + 13) % (SEQ - 7)

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        rng = np.random.default_rng(self.offset + i)
        n = self.length(i)
        walk = [int(rng.integers(VOCAB))]
        for _ in range(n):
            walk.append(int(self.table[walk[-1], rng.integers(3)]))
        tokens = torch.zeros(SEQ, dtype=torch.long)
        targets = torch.full((SEQ,), PAD, dtype=torch.long)
        tokens[:n] = torch.tensor(walk[:-1])
        targets[:n] = torch.tensor(walk[1:])
        return tokens, targets


def analyze(train: Walks, save_path: str) -> str:
    DataAnalyzer(train, batch_size=256, metric_names=["seqlen"],
                 metric_functions=[lambda batch: (batch[1] != PAD).sum(1)],
                 metric_types=["single_value_per_sample"], metric_dtypes=[torch.long],
                 save_path=save_path).run_map_reduce()
    return f"{save_path}/seqlen/seqlen"


def curriculum_batches(train, index, steps, batch, seed, cluster_dir):
    config = {"enabled": True, "seed": seed, "data_sampling": {"curriculum_learning": {
        "enabled": True, "data_cluster_path": cluster_dir, "curriculum_metrics": {"seqlen": {
            "index_to_sample_path": f"{index}_index_to_sample",
            "index_to_metric_path": f"{index}_index_to_metric",
            "difficulty_type": "value", "clustering_type": "schedule_based",
            "min_difficulty": 8, "max_difficulty": SEQ, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": steps // 2, "difficulty_step": 8}}}}}}
    sampler = DeepSpeedDataSampler(config, len(train), batch, 0, 1)
    return iter(sampler)


def uniform_batches(train, batch, seed):
    rng = np.random.default_rng(seed)
    while True:
        yield rng.integers(len(train), size=batch).tolist()


def evaluate(model, val) -> float:
    model.eval()
    with torch.no_grad():
        tokens = torch.stack([val[i][0] for i in range(len(val))])
        targets = torch.stack([val[i][1] for i in range(len(val))])
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=PAD)
    model.train()
    return float(loss)


def train(kind, train_set, val, index, args, seed, cluster_dir) -> dict:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, seq_len=SEQ, n_layer=2, n_head=4, d_model=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    batches = curriculum_batches(train_set, index, args.steps, args.batch, seed, cluster_dir) \
        if kind == "curriculum" else uniform_batches(train_set, args.batch, seed)
    tokens_seen, curve, start = 0, [], time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            curve.append({"step": step, "tokens": tokens_seen, "val_loss": evaluate(model, val)})
        if step == args.steps:
            break
        ids = next(batches)
        tokens = torch.stack([train_set[i][0] for i in ids])
        targets = torch.stack([train_set[i][1] for i in ids])
        width = int((targets != PAD).sum(1).max())  # cut the padding (Megatron's truncation)
        logits = model(tokens[:, :width])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[:, :width].reshape(-1),
                               ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tokens_seen += int((targets != PAD).sum())
    return {"curve": curve, "seconds": time.perf_counter() - start}


def tokens_to_reach(curve, target) -> int | None:
    return next((p["tokens"] for p in curve if p["val_loss"] <= target), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8192)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = successor_table()
    train_set = Walks(args.samples, table)
    val = Walks(256, table, offset=10**6, full=True)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        index = analyze(train_set, f"{work}/analysis")
        for seed in range(args.seeds):
            for kind in ("curriculum", "uniform"):
                result = train(kind, train_set, val, index, args, seed,
                               f"{work}/clusters_{seed}")
                runs.append({"kind": kind, "seed": seed, **result})
                last = result["curve"][-1]
                print(f"seed {seed} {kind:10s}: val loss {last['val_loss']:.4f} after "
                      f"{last['tokens']} tokens ({result['seconds']:.0f} s)", flush=True)
    summary = []
    for seed in range(args.seeds):
        cur, uni = (next(r for r in runs if r["seed"] == seed and r["kind"] == k)
                    for k in ("curriculum", "uniform"))
        target = uni["curve"][-1]["val_loss"]
        summary.append({
            "seed": seed, "uniform_final_val_loss": target,
            "curriculum_final_val_loss": cur["curve"][-1]["val_loss"],
            "uniform_tokens": uni["curve"][-1]["tokens"],
            "curriculum_tokens": cur["curve"][-1]["tokens"],
            "uniform_tokens_to_reach_uniform_final": tokens_to_reach(uni["curve"], target),
            "curriculum_tokens_to_reach_uniform_final": tokens_to_reach(cur["curve"], target)})
    out = {"what": "curriculum (seqlen) vs uniform sampling, val loss vs tokens",
           "model": "examples/gpt.py GPT n_layer 2 d_model 64 n_head 4, vocab 64, seq 64",
           "data": f"{args.samples} Markov-chain walks of 8..64 tokens, 3 successors per token",
           "args": vars(args), "loadavg": os.getloadavg(), "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    path = results / f"data_efficiency-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
