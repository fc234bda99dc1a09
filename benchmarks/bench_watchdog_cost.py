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
- ``plain``: the same for a plain torch script (no engine; one ``torch.distributed.all_reduce``
  per gradient, the most collectives per step a script makes), whose collectives only the
  bootstrap's recording sees (``dslaunch/torch_progress.py``): ``call_us`` is what the recording
  adds to one ``dist.all_reduce`` (one process, a one-rank gloo group: the wrapped call's time
  minus the original's, median of alternating batches); ``train`` alternates blocks with the
  recording installed and uninstalled in one ``watchdog_cost_rank.py --plain`` job;
  ``noise_floor`` the same job with it uninstalled in both kinds of block (``--aa``): what the
  block comparison shows with nothing to measure; ``record_share_of_step`` = collectives per
  step x ``call_us`` / step time.

``--quick`` (tests/test_bench_watchdog_cost.py, which checks that every part runs, not the
figures): no ``--aa`` job (no ``plain.noise_floor``) and a tenth of the calls per batch in the two
one-process micro-measurements (``record`` and ``plain.call``): noisier figures, not for quoting.

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


def plain_call_cost(n: int = 3000, batches: int = 9) -> dict:
    """Microseconds the recording adds to one dist.all_reduce (a 1-element tensor, one-rank gloo
    group): alternating batches with it installed and not, in this process."""
    import torch
    import torch.distributed as dist

    from dslaunch import torch_progress

    with tempfile.TemporaryDirectory() as d:
        writer = progress_record.ProgressWriter(os.path.join(d, "progress.bin"))
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        t = torch.ones(1)
        on, off = [], []
        try:
            for i in range(batches * 2):
                recorded = i % 4 in (0, 3)
                if recorded:
                    torch_progress.install(writer)
                else:
                    torch_progress.uninstall()
                t0 = time.perf_counter()
                for _ in range(n):
                    dist.all_reduce(t)
                (on if recorded else off).append((time.perf_counter() - t0) / n * 1e6)
        finally:
            torch_progress.uninstall()
            dist.destroy_process_group()
    return {"call_us": round(statistics.median(on) - statistics.median(off), 3),
            "all_reduce_us_on": round(statistics.median(on), 3),
            "all_reduce_us_off": round(statistics.median(off), 3), "calls_per_batch": n,
            "batches": batches}


def _train(steps: int, warmup: int, block: int, smoke: bool, workdir: Path,
           plain: bool = False, aa: bool = False) -> dict:
    """One job of watchdog_cost_rank.py: its on and off step times, interleaved in blocks."""
    out = workdir / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2",
           "--master-port", str(bu.free_port()), "--omp-threads", "1",
           str(HERE / "watchdog_cost_rank.py"), "--out", str(out), "--steps", str(steps),
           "--warmup", str(warmup), "--block", str(block)] + (["--smoke"] if smoke else []) \
        + (["--plain"] if plain else []) + (["--aa"] if aa else [])
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"training run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads((out / "blocks.json").read_text())
    on, off = res["step_seconds"]["on"], res["step_seconds"]["off"]
    return {"on_s": statistics.median(on), "off_s": statistics.median(off),
            "collectives_per_step": res["collectives"] / (warmup + len(on)),
            "false_alarm": "hang watchdog" in r.stderr}


def _train_summary(runs: list, smoke: bool, steps: int, warmup: int, block: int,
                   repeats: int, plain: bool) -> dict:
    on = statistics.median(1 / r["on_s"] for r in runs)
    off = statistics.median(1 / r["off_s"] for r in runs)
    return {"model": "tiny GPT (smoke)" if smoke else "bench GPT 27.4M",
            **({"loop": "plain torch, all_reduce per gradient"} if plain else {"zero_stage": 2}),
            "ranks": 2, "steps": steps, "warmup": warmup, "block": block,
            "repeats": repeats, "steps_per_s_on": round(on, 4),
            "steps_per_s_off": round(off, 4), "slowdown": round(1 - on / off, 4),
            "runs": [{k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}
                     for r in runs],
            "false_alarms": sum(r["false_alarm"] for r in runs)}


def measure(repeats: int = 3, steps: int = 40, smoke: bool = False, warmup: int = 5,
            block: int = 5, plain: bool = False, quick: bool = False) -> dict:
    """The benchmark's result (see the module docstring)."""
    runs, plain_runs, aa_runs = [], [], []
    kinds = ((False, False, runs), (True, False, plain_runs), (True, True, aa_runs))
    micro = 10 if quick else 1  # the micro-measurements' calls per batch divided by this
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for is_plain, aa, into in kinds[:(2 if quick else 3) if plain else 1]:
                res = _train(steps, warmup, block, smoke, Path(d), plain=is_plain, aa=aa)
                into.append(res)
                what = " (plain torch, off in both)" if aa else " (plain torch)" if is_plain else ""
                bu.log(f"  run {i + 1}/{repeats}{what}: {1 / res['on_s']:.3f} steps/s in the "
                       f"'on' blocks, {1 / res['off_s']:.3f} in the 'off' ones")
    record = record_cost(n=20000 // micro)
    coll = statistics.median(r["collectives_per_step"] for r in runs)
    step_s = statistics.median(r["off_s"] for r in runs)
    share = (coll * record["collective_us"] + record["step_us"]) * 1e-6 / step_s
    result = {
        "record": record,
        "collectives_per_step": round(coll, 2),
        "record_share_of_step": round(share, 6),
        "train": _train_summary(runs, smoke, steps, warmup, block, repeats, False),
    }
    if plain:
        call = plain_call_cost(n=3000 // micro)
        pcoll = statistics.median(r["collectives_per_step"] for r in plain_runs)
        pstep = statistics.median(r["off_s"] for r in plain_runs)
        result["plain"] = {
            "call": call, "collectives_per_step": round(pcoll, 2),
            "record_share_of_step": round(pcoll * max(call["call_us"], 0.0) * 1e-6 / pstep, 6),
            "train": _train_summary(plain_runs, smoke, steps, warmup, block, repeats, True)}
        if not quick:  # the same job with the recording off in both kinds of block: what the
            # comparison shows by itself on this machine
            result["plain"]["noise_floor"] = _train_summary(aa_runs, smoke, steps, warmup, block,
                                                            repeats, True)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (40; smoke 200)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 repeat unless given")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    p.add_argument("--no-plain", action="store_true", help="skip the plain torch measurement")
    p.add_argument("--quick", action="store_true",
                   help="no noise-floor job, a tenth of the micro-measurements' calls (for tests)")
    args = p.parse_args(argv)
    steps = args.steps or (200 if args.smoke else 40)
    result = {"benchmark": "watchdog_cost", "when": bu.now_iso(), "machine": bu.machine(),
              "git": bu.git_rev(), "command": "benchmarks/bench_watchdog_cost.py "
              + " ".join(argv if argv is not None else sys.argv[1:]),
              **measure(args.repeats, steps, args.smoke, plain=not args.no_plain,
                         quick=args.quick)}
    t, rc = result["train"], result["record"]
    bu.log(f"record: {rc['collective_us']} us per collective (enter+leave), {rc['step_us']} us per step")
    bu.log(f"{result['collectives_per_step']} collectives per step: the record writes take "
           f"{result['record_share_of_step'] * 100:.3f}% of a step")
    bu.log(f"train ({t['model']}, ZeRO-2, 2 ranks): {t['steps_per_s_on']} steps/s on, "
           f"{t['steps_per_s_off']} off: {t['slowdown'] * 100:+.2f}% slower; "
           f"false alarms {t['false_alarms']}")
    false_alarms = t["false_alarms"]
    if "plain" in result:
        pl = result["plain"]
        floor = (f" (off in both kinds of block: {pl['noise_floor']['slowdown'] * 100:+.2f}%)"
                 if "noise_floor" in pl else "")
        bu.log(f"plain torch: {pl['call']['call_us']} us added per dist.all_reduce "
               f"({pl['call']['all_reduce_us_off']} us without); {pl['collectives_per_step']} "
               f"collectives per step: {pl['record_share_of_step'] * 100:.3f}% of a step; train "
               f"{pl['train']['steps_per_s_on']} steps/s on, {pl['train']['steps_per_s_off']} "
               f"off: {pl['train']['slowdown'] * 100:+.2f}% slower{floor}; false alarms "
               f"{pl['train']['false_alarms']}")
        false_alarms += pl["train"]["false_alarms"]
    print(json.dumps(result, indent=1))
    if not args.no_save:
        bu.save_json(result, "watchdog_cost", HERE / "results")
    return 1 if false_alarms else 0


if __name__ == "__main__":
    sys.exit(main())
