#!/usr/bin/env python
"""What the ZeRO 1-2 shard copies of in-process recovery cost (engine/recovery/shard_copies.py).

    .venv/bin/python benchmarks/bench_shard_copies.py              # 2 ranks, ZeRO 2, 2 rounds
    .venv/bin/python benchmarks/bench_shard_copies.py --smoke      # tiny model, 1 round

Each round runs the same job twice, ``dslaunch run --nproc-per-node 2`` of this file's rank
part (an MLP of ``--layers`` x ``--width``^2 fp32 weights, AdamW, ZeRO ``--stage``), once with
``--recover in-process`` (each rank sends its optimizer shard to its buddy after every update)
and once without; the order alternates between rounds. Per job: rank 0's median step time over
the steps after the first two, and with the copies the median time of the exchange itself.
``overhead`` = median step time with copies / without - 1, per round and their median.

JSON to stdout and to benchmarks/results/shard_copies-<timestamp>.json; a table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def rank_main(args) -> None:
    import torch

    import dslaunch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())])
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": args.stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "steps_per_print": 10 ** 6}
    engine, *_ = dslaunch.initialize(model=model, config=config)
    copies = engine.strategy.copies
    exchange_times = []
    if copies is not None:  # time the exchange itself (measurement only)
        exchange = copies.exchange

        def timed(strategy):
            t0 = time.perf_counter()
            exchange(strategy)
            exchange_times.append(time.perf_counter() - t0)
        copies.exchange = timed
    steps = []
    for _ in range(args.steps):
        x = torch.randn(8, args.width)
        t0 = time.perf_counter()
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        steps.append(time.perf_counter() - t0)
    if engine.global_rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("RESULT " + json.dumps({
            "params": params, "copies": copies is not None,
            "step_s": statistics.median(steps[2:]),
            "exchange_s": statistics.median(exchange_times[2:]) if exchange_times else None}),
            flush=True)


def run_job(args, in_process: bool) -> dict:
    cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2"]
    if in_process:
        cmd += ["--recover", "in-process"]
    cmd += [__file__, "--rank-part", "--steps", str(args.steps), "--layers", str(args.layers),
            "--width", str(args.width), "--stage", str(args.stage)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"job failed ({r.returncode}):\n{r.stderr[-3000:]}")
    line = next(ln for ln in r.stdout.splitlines() if "RESULT " in ln)
    return json.loads(line.split("RESULT ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="tiny model, one round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--stage", type=int, default=2, choices=(1, 2))
    args = ap.parse_args()
    if args.rank_part:
        return rank_main(args)
    if args.smoke:
        args.rounds, args.steps, args.layers, args.width = 1, 6, 2, 64
    rounds = []
    for i in range(args.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        res = {flag: run_job(args, flag) for flag in order}
        rounds.append({"without": res[False], "with": res[True],
                       "overhead": res[True]["step_s"] / res[False]["step_s"] - 1})
    out = {"bench": "shard_copies", "stage": args.stage, "ranks": 2,
           "params": rounds[0]["with"]["params"], "rounds": rounds,
           "overhead_median": statistics.median(r["overhead"] for r in rounds),
           "load_average": os.getloadavg()[0]}
    text = json.dumps(out, indent=1)
    print(text)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / f"shard_copies-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    for r in rounds:
        sys.stderr.write(f"step {r['without']['step_s'] * 1e3:.1f} ms without copies, "
                         f"{r['with']['step_s'] * 1e3:.1f} ms with (exchange "
                         f"{(r['with']['exchange_s'] or 0) * 1e3:.1f} ms): "
                         f"overhead {r['overhead'] * 100:+.1f}%\n")


if __name__ == "__main__":
    main()
