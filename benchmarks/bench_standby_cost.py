#!/usr/bin/env python
"""What the standby process of in-process recovery costs a job that has no fault.

    .venv/bin/python benchmarks/bench_standby_cost.py              # 4 rounds, 600 steps
    .venv/bin/python benchmarks/bench_standby_cost.py --smoke      # 1 round, 40 steps

With ``--recover in-process`` each agent starts one standby process beside its ranks
(launcher/agent_recovery.py): it runs the script up to dslaunch's first call, imports the engine and
waits to replace a lost rank. On a host with few cores its start takes CPU from the ranks' own.
Variants, the same job each (``dslaunch run --nproc-per-node 2`` of tests/scripts/inject_train.py,
ZeRO 0 so that no shard copies run), in turn within each round, the order rotated per round:

- ``plain``: no ``--recover`` (no standby);
- ``no_standby``: ``--recover in-process`` with ``DSLAUNCH_RECOVER_STANDBY=0``;
- ``standby_same_priority``: the standby at the ranks' priority (``DSLAUNCH_STANDBY_NICE=0``);
- ``standby``: the default (the standby at niceness +10 until promoted: standby_priority.py).

Per job: ``wall_s`` (the launcher's whole run), ``to_first_step_s`` (launch to the last rank's
first step) and ``train_s`` (first step to last). JSON to stdout and to
benchmarks/results/standby_cost-<timestamp>.json; a table of medians to stderr.
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
SCRIPT = ROOT / "tests" / "scripts" / "inject_train.py"
VARIANTS = {  # name: (extra launcher flags, extra environment)
    "plain": ([], {}),
    "no_standby": (["--recover", "in-process"], {"DSLAUNCH_RECOVER_STANDBY": "0"}),
    "standby_same_priority": (["--recover", "in-process"], {"DSLAUNCH_STANDBY_NICE": "0"}),
    "standby": (["--recover", "in-process"], {}),
}


def run_job(name: str, steps: int) -> dict:
    flags, extra = VARIANTS[name]
    env = {**os.environ, **extra}
    env.pop("DSLAUNCH_CONFIG", None)
    cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2", *flags, str(SCRIPT),
           "--steps", str(steps)]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name}: job failed ({r.returncode}):\n{r.stderr[-3000:]}")
    first, last = {}, {}
    for line in r.stdout.splitlines():
        word = line.split()
        if "STEP" in word:  # [prefix] STEP rank step time attempt
            i = word.index("STEP")
            rank, at = word[i + 1], float(word[i + 3])
            first.setdefault(rank, at)
            last[rank] = at
    if len(first) != 2:
        raise SystemExit(f"{name}: expected 2 ranks' steps, got {sorted(first)}")
    return {"wall_s": round(wall, 3), "to_first_step_s": round(max(first.values()) - t0, 3),
            "train_s": round(max(last.values()) - max(first.values()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--smoke", action="store_true", help="1 round of 40 steps")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.steps = 1, 40
    names = list(VARIANTS)
    rounds = []
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        rounds.append({name: run_job(name, args.steps) for name in order})
        print(f"round {i + 1}: " + json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    medians = {n: {k: round(statistics.median(r[n][k] for r in rounds), 3)
                   for k in ("wall_s", "to_first_step_s", "train_s")} for n in names}
    out = {"bench": "standby_cost", "steps": args.steps, "ranks": 2, "cores": os.cpu_count(),
           "load_before": os.getloadavg()[0], "rounds": rounds, "median": medians}
    text = json.dumps(out, indent=1)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"standby_cost-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    print(f"{'variant':24} {'wall s':>8} {'to step 1 s':>12} {'train s':>8}", file=sys.stderr)
    for n, m in medians.items():
        print(f"{n:24} {m['wall_s']:8.2f} {m['to_first_step_s']:12.2f} {m['train_s']:8.2f}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
