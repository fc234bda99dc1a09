#!/usr/bin/env python
"""Pipeline / tensor-parallel benchmark: bubble, activation memory, tokens/s per layout, and
DeepSpeed's PipelineModule on the same model and schedule, side by side in one run.

Model: examples/gpt.py bench_config() (27.4M params) as 8 layer specs (Embed, Block x 6, Head),
seq 128, torch Adam lr 1e-3 under both runtimes, OMP_NUM_THREADS=1, gloo
(benchmarks/pipe_bench_rank.py runs every configuration).

    .venv/bin/python benchmarks/bench_pipe.py                 # everything (tens of minutes)
    .venv/bin/python benchmarks/bench_pipe.py --parts peer    # dslaunch vs DeepSpeed only
    .venv/bin/python benchmarks/bench_pipe.py --smoke         # tiny model, no peer, seconds

Parts:
  peer      2 stages on 2 ranks, 1F1B, micro-batch 4 x 1 and 1 x 4 (512 tokens per step, the
            issue's DeepSpeed measurement), dslaunch and DeepSpeed interleaved, --repeats times;
            ratio = dslaunch tokens/s / DeepSpeed tokens/s (medians over repeats); each rank's
            CPU seconds per step beside it (what the work costs, whatever the load).
  schedule  2 stages, 8 micro-batches, 1F1B vs GPipe with saved-activation accounting: per stage
            the most micro-batches held at once and the bytes autograd kept for them (1F1B: at
            most P - s micro-batches on stage s; GPipe: all M).
  layouts   4 ranks, 8 sequences per step: pipe4, pipe2 x dp2, tp2 x dp2, pipe2 x tp2 (dslaunch),
            and pipe4, pipe2 x dp2 under DeepSpeed.
Bubble (every dslaunch pipeline run): per stage 1 - (load + forward + backward seconds) /
(seconds of the schedule, optimizer step excluded), against the theory (P - 1) / (M + P - 1) for 1F1B. With more ranks
than cores the busy time includes waiting for a core: read 4-rank bubbles with the load average.
JSON to stdout and benchmarks/results/pipe-<timestamp>.json; a table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

RANK_SCRIPT = Path(__file__).resolve().parent / "pipe_bench_rank.py"
PARTS = ("peer", "schedule", "layouts")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--parts", default=",".join(PARTS), help="comma list of " + ", ".join(PARTS))
    p.add_argument("--no-peer", action="store_true", help="skip DeepSpeed")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 step, no peer")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    args.part_list = [x for x in args.parts.split(",") if x]
    for part in args.part_list:
        if part not in PARTS:
            p.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
    if args.smoke:
        args.no_peer = True
        args.repeats = 1
    args.steps = args.steps or (1 if args.smoke else 6)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 2)
    return args


def run_config(args, runtime, nproc, pp, tp=1, micro=1, gas=4, schedule="1f1b",
               measure=False) -> dict:
    """One job; returns the ranks' records plus what the harness derives from them."""
    with tempfile.TemporaryDirectory(prefix="bench_pipe_") as tmp:
        return _run_config_in(Path(tmp), args, runtime, nproc, pp, tp, micro, gas, schedule,
                              measure)


def _run_config_in(out, args, runtime, nproc, pp, tp, micro, gas, schedule, measure) -> dict:
    flags = ["--runtime", runtime, "--out", str(out), "--pp", pp, "--tp", tp, "--micro", micro,
             "--gas", gas, "--schedule", schedule, "--steps", args.steps,
             "--warmup", args.warmup] + (["--measure-activations"] if measure else []) + \
        (["--tiny"] if args.smoke else [])
    flags = [str(f) for f in flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if runtime == "dslaunch":
        dsl = bu.venv_bin("dslaunch")
        cmd = ([dsl] if dsl else [sys.executable, "-m", "dslaunch.cli"]) + [
            "run", "--nproc-per-node", str(nproc), "--omp-threads", "1", str(RANK_SCRIPT)] + flags
    else:
        py = bu.peer_python(create=False)
        cmd = [str(Path(py).parent / "torchrun"), "--standalone", "--nproc-per-node", str(nproc),
               str(RANK_SCRIPT)] + flags
    desc = {"runtime": runtime, "nproc": nproc, "pp": pp, "tp": tp, "dp": nproc // (pp * tp),
            "micro": micro, "gas": gas, "schedule": schedule, "measure_activations": measure}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=bu.REPO, env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    desc["wall_s"] = round(time.perf_counter() - t0, 1)
    desc["loadavg"] = bu.loadavg()
    if proc.returncode != 0:
        desc["error"] = (proc.stdout + proc.stderr)[-3000:]
        bu.log(f"  {runtime} pp{pp} tp{tp} {micro}x{gas} {schedule}: FAILED "
               f"(rc {proc.returncode})\n{desc['error'][-800:]}")
        return desc
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(nproc)]
    step_s = bu.median(ranks[0]["times"])  # between barriers: the slowest rank's step
    desc.update({"tokens_per_step": ranks[0]["tokens_per_step"], "median_step_s": step_s,
                 "tokens_per_s": round(ranks[0]["tokens_per_step"] / step_s, 1),
                 "cpu_s_per_step_per_rank": [round(bu.median(r["cpu_s"]), 3) for r in ranks],
                 "losses": ranks[0]["losses"], "parts": ranks[0]["parts"],
                 "params_per_rank": [r["params"] for r in ranks]})
    if runtime == "dslaunch":
        desc.update(_pipeline_facts(ranks, pp, gas))
    bu.log(f"  {runtime:9s} pp{pp} tp{tp} dp{desc['dp']} {micro}x{gas} {schedule:5s}: "
           f"{desc['tokens_per_s']:8.1f} tokens/s (step {step_s:.3f} s, load {desc['loadavg']})")
    return desc


def _pipeline_facts(ranks, pp, m) -> dict:
    stages = {}
    for r in ranks:  # the first rank of each stage speaks for it
        stages.setdefault(r["stage"], r)
    bubble, live, nbytes, busy = [], [], [], []
    for s in sorted(stages):
        t = stages[s]["pipe_times"]
        work = t.get("load", 0.0) + t.get("forward", 0.0) + t.get("backward", 0.0)
        total = t.get("total", 0.0) - t.get("step", 0.0)  # the schedule without the optimizer
        busy.append(round(work, 4))
        bubble.append(round(1.0 - work / total, 4) if total else None)
        live.append(stages[s]["peak_live_micro_batches"])
        nbytes.append(stages[s]["peak_activation_bytes"])
    out = {"peak_live_micro_batches": live, "p2p_headers_with_shapes":
           [stages[s]["p2p"]["headers_with_shapes"] for s in sorted(stages)]}
    if pp > 1:
        out.update({"bubble_measured_per_stage": bubble,
                    "bubble_measured_mean": round(sum(bubble) / len(bubble), 4),
                    "bubble_theory_1f1b": round((pp - 1) / (m + pp - 1), 4),
                    "busy_s_per_stage": busy})
    if any(nbytes):
        out["peak_activation_bytes"] = nbytes
    return out


def part_peer(args) -> dict:
    shapes = [(4, 1), (1, 4)]
    runtimes = ["dslaunch"] + ([] if args.no_peer else ["deepspeed"])
    runs = {f"{rt}_{mb}x{g}": [] for rt in runtimes for mb, g in shapes}
    for rep in range(args.repeats):
        bu.log(f"peer: round {rep + 1}/{args.repeats}")
        for mb, g in shapes:
            order = runtimes if rep % 2 == 0 else runtimes[::-1]  # alternate who goes first
            for rt in order:
                runs[f"{rt}_{mb}x{g}"].append(run_config(args, rt, 2, 2, micro=mb, gas=g))
    summary = {}
    for key, rs in runs.items():
        summary[key] = {"tokens_per_s_median": bu.median([r.get("tokens_per_s") for r in rs]),
                        "tokens_per_s_all": [r.get("tokens_per_s") for r in rs],
                        "cpu_s_per_step_all": [r.get("cpu_s_per_step_per_rank") for r in rs],
                        "loadavg_1min_all": [(r.get("loadavg") or [None])[0] for r in rs]}
    for mb, g in shapes:
        if not args.no_peer:
            summary[f"ratio_{mb}x{g}"] = bu.ratio(summary[f"dslaunch_{mb}x{g}"]
                                                  ["tokens_per_s_median"],
                                                  summary[f"deepspeed_{mb}x{g}"]
                                                  ["tokens_per_s_median"])
    return {"summary": summary, "runs": runs}


def part_schedule(args) -> dict:
    m = 8
    out = {}
    for sched in ("1f1b", "gpipe"):
        out[sched] = run_config(args, "dslaunch", 2, 2, micro=1, gas=m, schedule=sched,
                                measure=True)
    a, b = out["1f1b"].get("peak_activation_bytes"), out["gpipe"].get("peak_activation_bytes")
    if a and b:
        out["gpipe_over_1f1b_bytes_per_stage"] = [round(y / x, 2) for x, y in zip(a, b)]
    return out


def part_layouts(args) -> dict:
    seqs = 8  # sequences per step for every layout
    layouts = [("pipe4", 4, 1), ("pipe2_x_dp2", 2, 1), ("tp2_x_dp2", 1, 2), ("pipe2_x_tp2", 2, 2)]
    out = {}
    for name, pp, tp in layouts:
        dp = 4 // (pp * tp)
        out[f"dslaunch_{name}"] = run_config(args, "dslaunch", 4, pp, tp, micro=1, gas=seqs // dp)
    if not args.no_peer:
        for name, pp, _tp in layouts[:2]:
            dp = 4 // pp
            out[f"deepspeed_{name}"] = run_config(args, "deepspeed", 4, pp, 1, micro=1,
                                                  gas=seqs // dp)
            d, p = out[f"dslaunch_{name}"].get("tokens_per_s"), out[f"deepspeed_{name}"].get(
                "tokens_per_s")
            out[f"ratio_{name}"] = bu.ratio(d, p)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_peer and bu.peer_python(create=False) is None:
        bu.log("bench_pipe: DeepSpeed peer venv not ready (python benchmarks/peers.py); "
               "running without it")
        args.no_peer = True
    result = {"benchmark": "pipe", "time": bu.now_iso(), "machine": bu.machine(),
              "loadavg_start": bu.loadavg(), "git": bu.git_rev(),
              "versions": {"torch": bu.pkg_version("torch"),
                           "deepspeed": None if args.no_peer else
                           bu.pkg_version("deepspeed", bu.peer_python(create=False))},
              "settings": {"repeats": args.repeats, "steps": args.steps, "warmup": args.warmup,
                           "smoke": args.smoke, "model": "tiny" if args.smoke else
                           "bench_config 27.4M, 8 layer specs, seq 128",
                           "optimizer": "torch.optim.Adam lr 1e-3 (both runtimes)"}}
    for part in args.part_list:
        bu.log(f"== {part}")
        result[part] = {"peer": part_peer, "schedule": part_schedule,
                        "layouts": part_layouts}[part](args)
    result["loadavg_end"] = bu.loadavg()
    path = None if args.no_save else bu.save_json(result, "pipe", Path(args.results_dir))
    print(json.dumps(result, indent=1))
    if path:
        bu.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
