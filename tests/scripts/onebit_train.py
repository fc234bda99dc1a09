"""Rank script for the 1-bit optimizer tests and benchmark: trains the tiny example GPT through
dslaunch's public API with the config's optimizer and writes --out/rank_{r}.json: per-step global
mean loss, per-step bytes each collective booked in engine.comm_stats() (the difference of two
snapshots around the step: payload ``step_bytes`` and sent ``step_sent``), the step's wall time
and the part of it spent in the engine's collectives (``step_comm_seconds``),
the optimizer's stage, the final loss on --eval-batches held-out batches, and a checksum of the
parameters.

``--runs SPEC.json`` (a list of {"name", "config", and any of the options below as overrides,
e.g. "steps", "save_dir", "save_at", "load_dir", "eval_batches"}) trains each entry in turn in
the same ranks, from a fresh model, and writes --out/<name>/rank_{r}.json: the tests run many
optimizer configs without starting torch once per config.

Data: TextBatches(global batch = train_batch_size).batch_at(step, rank, world), cut into the
gradient-accumulation micro-batches in order (the same rows whatever the optimizer)."""

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dslaunch
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--d-model", type=int, default=64)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--save-dir")
p.add_argument("--save-at", type=int, default=-1)
p.add_argument("--load-dir")
p.add_argument("--eval-batches", type=int, default=0)
p.add_argument("--runs")
dslaunch.add_config_arguments(p)


def train(args):
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(seq_len=args.seq, n_layer=args.layers, d_model=args.d_model, n_head=2))
    engine, optimizer, _, _ = dslaunch.initialize(args=args, model=model,
                                                  model_parameters=model.parameters())
    rank, world = engine.global_rank, engine.world_size
    mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    text = stdlib_bytes(1 << 20)
    batches = TextBatches(text, seq_len=args.seq, global_batch=engine.train_batch_size(),
                          seed=args.seed)
    # embedding rows of bytes absent from the whole text: never a gradient, must never move
    absent = sorted(set(range(256)) - set(torch.unique(text).tolist()))
    absent_rows0 = engine.module.tok_emb.weight.detach()[absent].float().clone()

    start = 0
    if args.load_dir:
        engine.load_checkpoint(args.load_dir)
        start = engine.global_steps

    def snapshot(key="bytes"):
        return {k: v[key] for k, v in engine.comm_stats().items()}

    def delta(after, before):
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    rec = {"rank": rank, "world": world, "start": start, "losses": [], "step_bytes": [],
           "step_sent": [], "step_seconds": [], "step_comm_seconds": [], "compressing": [],
           "optimizer": type(optimizer).__name__,
           "num_params": sum(p.numel() for p in model.parameters())}
    for step in range(start, args.steps):
        tokens, targets = batches.batch_at(step, rank, world)
        before, before_sent = snapshot(), snapshot("sent_bytes")
        before_s = sum(snapshot("seconds").values())
        t0 = time.perf_counter()
        total = torch.zeros(())
        stage = getattr(optimizer, "in_compression_stage", lambda: False)()
        for i in range(gas):
            loss = engine(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
            total += loss.detach().float()
            engine.backward(loss)
            engine.step()
        rec["step_seconds"].append(time.perf_counter() - t0)
        # time spent inside the engine's collectives (waiting on the link included)
        rec["step_comm_seconds"].append(sum(snapshot("seconds").values()) - before_s)
        rec["step_bytes"].append(delta(snapshot(), before))
        rec["step_sent"].append(delta(snapshot("sent_bytes"), before_sent))
        rec["compressing"].append(bool(stage))
        mean = total / gas
        dist.all_reduce(mean)  # outside the engine (not booked): the global loss, for comparison
        rec["losses"].append(mean.item() / world)
        if args.save_dir and step + 1 == args.save_at:
            engine.save_checkpoint(args.save_dir, tag="ckpt")

    with torch.no_grad():
        if args.eval_batches:  # batches far past the training ones: held out
            held = torch.zeros(())
            for i in range(args.eval_batches):
                tokens, targets = batches.batch_at(10 ** 6 + i, rank, world)
                held += engine(tokens, targets).detach().float()
            dist.all_reduce(held)
            rec["eval_loss"] = held.item() / args.eval_batches / world
        h = hashlib.sha256()
        for t in engine.module.parameters():
            h.update(t.detach().float().cpu().numpy().tobytes())
    rec["param_sha"] = h.hexdigest()
    rec["absent_rows"] = len(absent)
    rec["absent_rows_moved"] = (engine.module.tok_emb.weight.detach()[absent].float()
                                - absent_rows0).abs().max().item() if absent else 0.0
    rec["comm_stats"] = engine.comm_stats()
    rec["memory"] = engine.memory_breakdown()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
        json.dump(rec, f)


args = p.parse_args()
if args.runs is None:
    train(args)
else:
    for spec in json.loads(Path(args.runs).read_text()):
        run = argparse.Namespace(**vars(args))
        run.deepspeed_config = spec.pop("config")
        run.out = os.path.join(args.out, spec.pop("name"))
        for k, v in spec.items():
            assert hasattr(run, k), f"--runs: unknown option {k!r}"
            setattr(run, k, v)
        train(run)
