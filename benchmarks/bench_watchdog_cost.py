#!/usr/bin/env python
"""What the hang watchdog costs: microseconds per collective, and training steps/s with it on vs off.

    .venv/bin/python benchmarks/bench_watchdog_cost.py                 # 2 ranks, ZeRO-2, 3 repeats
    .venv/bin/python benchmarks/bench_watchdog_cost.py --smoke         # tiny model, 1 repeat

- ``record``: one process, a real progress record file (``progress_record.ProgressWriter``):
  the cost of ``enter`` + ``leave`` (what every collective through the comm layer adds) and of
  ``step``, in microseconds, median of several batches.
- ``train``: ``dslaunch run --nproc-per-node 2 benchmarks/dslaunch_train.py --stage 2`` (the bench
  GPT of bench_train.py, or its tiny version with ``--smoke``), alternately with the watchdog on
  (the default ``--hang-timeout``, every rank writing its record) and off (``--hang-timeout 0``
  and the record not written: ``watchdog_cost_rank.py`` drops DSLAUNCH_PROGRESS_FILE before the
  script starts). steps/s = 1 / median step time (a step's time: the slowest rank's); per mode
  the median over repeats; ``slowdown`` = 1 - on / off. A false alarm (a hang report in a fault-free
  run) is counted and fails the run.
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


def _train(on: bool, steps: int, warmup: int, smoke: bool, workdir: Path) -> dict:
    out = workdir / f"{'on' if on else 'off'}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2",
           "--master-port", str(bu.free_port()), "--omp-threads", "1"]
    if not on:
        cmd += ["--hang-timeout", "0"]
    cmd += [str(HERE / "watchdog_cost_rank.py"), "--out", str(out), "--stage", "2",
            "--steps", str(steps), "--warmup", str(warmup)] + (["--smoke"] if smoke else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if not on:
        env["WATCHDOG_COST_OFF"] = "1"
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"training run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    ranks = [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]
    times = [max(ts) for ts in zip(*(rk["step_seconds"][warmup:] for rk in ranks))]
    res = {"steps_per_s": 1.0 / statistics.median(times), "step_s": statistics.median(times),
           "false_alarm": "hang watchdog" in r.stderr}
    counts = out / "collectives0.json"
    if on and counts.exists():  # numbered collectives of rank 0, every group
        res["collectives_per_step"] = sum(json.loads(counts.read_text()).values()) / (steps + warmup)
    return res


def measure(repeats: int = 3, steps: int = 30, smoke: bool = False, warmup: int = 5) -> dict:
    """The benchmark's result (see the module docstring)."""
    runs: dict = {"on": [], "off": []}
    alarms, per_step, step_s = 0, [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")  # alternate: drift cancels out
            for mode in order:
                res = _train(mode == "on", steps, warmup, smoke, Path(d))
                runs[mode].append(round(res["steps_per_s"], 4))
                alarms += res["false_alarm"]
                step_s.append(res["step_s"])
                if "collectives_per_step" in res:
                    per_step.append(res["collectives_per_step"])
                bu.log(f"  repeat {i + 1}/{repeats} watchdog {mode}: {res['steps_per_s']:.3f} steps/s")
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    record = record_cost()
    # the record's share of a step, from its own cost: below the run-to-run noise of steps/s
    coll = statistics.median(per_step) if per_step else 0.0
    bound = (coll * record["collective_us"] + record["step_us"]) * 1e-6 / statistics.median(step_s)
    return {
        "record": record,
        "collectives_per_step": round(coll, 2),
        "record_share_of_step": round(bound, 6),
        "train": {"model": "tiny GPT (smoke)" if smoke else "bench GPT 27.4M", "zero_stage": 2,
                  "ranks": 2, "steps": steps, "warmup": warmup, "repeats": repeats,
                  "steps_per_s_on": round(on, 4), "steps_per_s_off": round(off, 4),
                  "slowdown": round(1 - on / off, 4), "runs": runs, "false_alarms": alarms},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (30; smoke 40)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 repeat unless given")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = p.parse_args(argv)
    steps = args.steps or (40 if args.smoke else 30)
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
