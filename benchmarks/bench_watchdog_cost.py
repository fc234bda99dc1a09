#!/usr/bin/env python
"""What the hang watchdog costs: microseconds per collective, and training steps/s with it on vs off.

    .venv/bin/python benchmarks/bench_watchdog_cost.py                 # 2 ranks, ZeRO-2, 3 repeats
    .venv/bin/python benchmarks/bench_watchdog_cost.py --smoke         # tiny model, 1 repeat

- ``record``: one process, a real progress record file (``progress_record.ProgressWriter``):
  the cost of ``enter`` + ``leave`` (what every collective through the comm layer adds) and of
  ``step``, in microseconds, median of several batches.
- ``train``: ``dslaunch run --nproc-per-node 2 benchmarks/watchdog_cost_rank.py`` (the bench GPT
  of bench_train.py under ZeRO-2, or its tiny version with ``--smoke``) with the watchdog on (the
  default ``--hang-timeout``), alternating blocks of steps with the progress record written and
  not in the same job (see that script for why). steps/s = 1 / median step time of rank 0 per
  mode; per mode the median over repeats; ``slowdown`` = 1 - on / off. A false alarm (a hang
  report in these fault-free runs) is counted and fails the benchmark.
- ``record_share_of_step``: (collectives per step x us per collective + us per step) / step time:
  the record's cost computed from its parts, for when steps/s varies more between runs (a busy
  machine) than the watchdog could change it.

``measure(repeats, steps, smoke)`` returns the result dict (bench_resilience.py imports it).
JSON to stdout and to benchmarks/results/watchdog_cost-<timestamp>.json; a table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "peer_scripts"))
sys.path.insert(0, str(ROOT))

import benchutil as bu  # noqa: E402

from dslaunch import progress_record  # noqa: E402


def record_cost(n: int = 20000, batches: int = 7) -> dict:
    """Microseconds per enter+leave pair and per step() on a real record file."""
    with tempfile.TemporaryDirectory() as d:
        w = progress_record.ProgressWriter(os.path.join(d, "progress.bin"))
        pairs, steps = [], []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(n):
                w.enter("all_reduce", "world", 4096)
                w.leave()
            pairs.append((time.perf_counter() - t0) / n * 1e6)
            t0 = time.perf_counter()
            for i in range(n):
                w.step(i)
            steps.append((time.perf_counter() - t0) / n * 1e6)
    return {"collective_us": round(statistics.median(pairs), 3),
            "step_us": round(statistics.median(steps), 3), "calls_per_batch": n,
            "batches": batches}


def _train(steps: int, warmup: int, block: int, smoke: bool, workdir: Path) -> dict:
    """One job of watchdog_cost_rank.py: its on and off step times, interleaved in blocks."""
    out = workdir / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2",
           "--master-port", str(bu.free_port()), "--omp-threads", "1",
           str(HERE / "watchdog_cost_rank.py"), "--out", str(out), "--steps", str(steps),
           "--warmup", str(warmup), "--block", str(block)] + (["--smoke"] if smoke else [])
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"training run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads((out / "blocks.json").read_text())
    on, off = res["step_seconds"]["on"], res["step_seconds"]["off"]
    return {"on_s": statistics.median(on), "off_s": statistics.median(off),
            "collectives_per_step": res["collectives"] / (warmup + len(on)),
            "false_alarm": "hang watchdog" in r.stderr}


def measure(repeats: int = 3, steps: int = 40, smoke: bool = False, warmup: int = 5,
            block: int = 5) -> dict:
    """The benchmark's result (see the module docstring)."""
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            res = _train(steps, warmup, block, smoke, Path(d))
            runs.append(res)
            bu.log(f"  run {i + 1}/{repeats}: {1 / res['on_s']:.3f} steps/s with the record, "
                   f"{1 / res['off_s']:.3f} without")
    on = statistics.median(1 / r["on_s"] for r in runs)
    off = statistics.median(1 / r["off_s"] for r in runs)
    record = record_cost()
    coll = statistics.median(r["collectives_per_step"] for r in runs)
    step_s = statistics.median(r["off_s"] for r in runs)
    share = (coll * record["collective_us"] + record["step_us"]) * 1e-6 / step_s
    return {
        "record": record,
        "collectives_per_step": round(coll, 2),
        "record_share_of_step": round(share, 6),
        "train": {"model": "tiny GPT (smoke)" if smoke else "bench GPT 27.4M", "zero_stage": 2,
                  "ranks": 2, "steps": steps, "warmup": warmup, "block": block,
                  "repeats": repeats, "steps_per_s_on": round(on, 4),
                  "steps_per_s_off": round(off, 4), "slowdown": round(1 - on / off, 4),
                  "runs": [{k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}
                           for r in runs],
                  "false_alarms": sum(r["false_alarm"] for r in runs)},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (40; smoke 200)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 repeat unless given")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = p.parse_args(argv)
    steps = args.steps or (200 if args.smoke else 40)
    result = {"benchmark": "watchdog_cost", "when": bu.now_iso(), "machine": bu.machine(),
              "git": bu.git_rev(), "command": "benchmarks/bench_watchdog_cost.py "
              + " ".join(argv if argv is not None else sys.argv[1:]),
              **measure(args.repeats, steps, args.smoke)}
    t, rc = result["train"], result["record"]
    bu.log(f"record: {rc['collective_us']} us per collective (enter+leave), {rc['step_us']} us per step")
    bu.log(f"{result['collectives_per_step']} collectives per step: the record writes take "
           f"{result['record_share_of_step'] * 100:.3f}% of a step")
    bu.log(f"train ({t['model']}, ZeRO-2, 2 ranks): {t['steps_per_s_on']} steps/s on, "
           f"{t['steps_per_s_off']} off: {t['slowdown'] * 100:+.2f}% slower; "
           f"false alarms {t['false_alarms']}")
    print(json.dumps(result, indent=1))
    if not args.no_save:
        bu.save_json(result, "watchdog_cost", HERE / "results")
    return 1 if t["false_alarms"] else 0


if __name__ == "__main__":
    sys.exit(main())
