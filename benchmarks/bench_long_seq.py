#!/usr/bin/env python
"""Long-sequence benchmark (issue 21): Ulysses sequence parallelism, dslaunch beside DeepSpeed.

    .venv/bin/python benchmarks/bench_long_seq.py                        # every part
    .venv/bin/python benchmarks/bench_long_seq.py --parts throughput --seqs 4096,16384 --ranks 2,4
    .venv/bin/python benchmarks/bench_long_seq.py --smoke                # tiny, no peer, seconds

Parts (``--parts``, comma-separated):
  throughput  tokens/s of the example GPT (examples/gpt.py; by default 1 layer, d_model 64,
              4 heads, vocab 256, torch AdamW, ZeRO 1, one sequence per data-parallel rank,
              OMP_NUM_THREADS=1, gloo) at each sequence length and rank count:
              - dslaunch, Ulysses over every rank (SP = ranks, DP 1),
              - DeepSpeed's DistributedAttention on the same model and length (SP = ranks;
                DeepSpeed from the peer venv, benchmarks/peers.py, started in this same command),
              - dslaunch, plain data parallelism (SP 1, DP = ranks: each rank a whole sequence).
              ratio_vs_deepspeed = dslaunch SP tokens/s / DeepSpeed SP tokens/s (same run);
              sp_over_dp = dslaunch SP tokens/s / dslaunch DP tokens/s.
  (memory: peak RSS per rank vs sequence length, with and without checkpointing and tiling,
  is added by the activation-checkpointing / tiled-compute work: register it in PARTS.)

Each configuration is a separate job (benchmarks/long_seq_rank.py); step times are medians over
--steps timed steps after --warmup, between barriers. The machine may be shared: the load average
is recorded next to every figure. JSON to stdout and benchmarks/results/long_seq-<time>.json.
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

RANK_SCRIPT = Path(__file__).resolve().parent / "long_seq_rank.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    p.add_argument("--seqs", default="4096,16384", help="sequence lengths")
    p.add_argument("--ranks", default="2,4", help="rank counts")
    p.add_argument("--n-layer", type=int, default=1)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="rounds (runtimes alternate first)")
    p.add_argument("--no-peer", action="store_true", help="skip DeepSpeed")
    p.add_argument("--no-dp", action="store_true", help="skip the plain data-parallel runs")
    p.add_argument("--smoke", action="store_true", help="seq 256, 2 ranks, 1 step, no peer")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    args.part_list = [x for x in args.parts.split(",") if x]
    for part in args.part_list:
        if part not in PARTS:
            p.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
    if args.smoke:
        args.seqs, args.ranks, args.steps, args.warmup, args.no_peer = "256", "2", 1, 0, True
    args.seq_list = [int(x) for x in args.seqs.split(",") if x]
    args.rank_list = [int(x) for x in args.ranks.split(",") if x]
    return args


def run_job(args, runtime: str, nproc: int, sp: int, seq: int) -> dict:
    """One configuration: the rank-0 record plus wall time and load."""
    desc = {"runtime": runtime, "nproc": nproc, "sp": sp, "dp": nproc // sp, "seq": seq}
    with tempfile.TemporaryDirectory(prefix="bench_long_seq_") as tmp:
        flags = [str(f) for f in ("--runtime", runtime, "--sp", sp, "--seq", seq, "--n-layer",
                                  args.n_layer, "--d-model", args.d_model, "--n-head",
                                  args.n_head, "--steps", args.steps, "--warmup", args.warmup,
                                  "--out", tmp)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if runtime == "dslaunch":
            dsl = bu.venv_bin("dslaunch")
            cmd = ([dsl] if dsl else [sys.executable, "-m", "dslaunch"]) + [
                "run", "--nproc-per-node", str(nproc), "--omp-threads", "1", str(RANK_SCRIPT)]
        else:
            py = bu.peer_python(create=False)
            cmd = [str(Path(py).parent / "torchrun"), "--standalone", "--nproc-per-node",
                   str(nproc), str(RANK_SCRIPT)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd + flags, cwd=bu.REPO, env=env, capture_output=True,
                                  text=True, timeout=args.timeout)
            failed = proc.returncode != 0 and (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            failed = f"timed out after {args.timeout} s"
        desc["wall_s"] = round(time.perf_counter() - t0, 1)
        desc["loadavg"] = bu.loadavg()
        if failed:
            desc["error"] = failed
            bu.log(f"  {runtime} sp{sp} x dp{nproc // sp} seq {seq}: FAILED\n{failed[-800:]}")
            return desc
        desc.update(json.loads((Path(tmp) / "result.json").read_text()))
    bu.log(f"  {runtime:9s} sp{sp} x dp{desc['dp']} seq {seq:6d}: {desc['tokens_per_s']:9.1f} "
           f"tokens/s (step {desc['median_step_s']:.3f} s, load {desc['loadavg']})")
    return desc


def part_throughput(args) -> dict:
    runs, summary = {}, {}
    for seq in args.seq_list:
        for nproc in args.rank_list:
            keys = {"dslaunch_sp": ("dslaunch", nproc)}
            if not args.no_dp:
                keys["dslaunch_dp"] = ("dslaunch", 1)
            if not args.no_peer:
                keys["deepspeed_sp"] = ("deepspeed", nproc)
            for rep in range(args.repeats):
                order = list(keys) if rep % 2 == 0 else list(keys)[::-1]
                for key in order:
                    runtime, sp = keys[key]
                    runs.setdefault(f"{key}_seq{seq}_ranks{nproc}", []).append(
                        run_job(args, runtime, nproc, sp, seq))
            row = {key: bu.median([r.get("tokens_per_s") for r in
                                   runs[f"{key}_seq{seq}_ranks{nproc}"]]) for key in keys}
            if not args.no_dp:
                row["sp_over_dp"] = bu.ratio(row["dslaunch_sp"], row["dslaunch_dp"])
            if not args.no_peer:
                row["ratio_vs_deepspeed"] = bu.ratio(row["dslaunch_sp"], row["deepspeed_sp"])
                same = [r.get("losses") for k in ("dslaunch_sp", "deepspeed_sp")
                        for r in runs[f"{k}_seq{seq}_ranks{nproc}"][:1]]
                row["loss_max_abs_diff_vs_deepspeed"] = bu.loss_diff(*same)
            summary[f"seq{seq}_ranks{nproc}"] = row
    return {"summary": summary, "runs": runs}


# part name -> function(args) -> dict; the memory part (peak RSS per rank vs sequence length at
# SP 1/2/4, with and without activation checkpointing and tiling) is added here
PARTS = {"throughput": part_throughput}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_peer and bu.peer_python(create=True) is None:
        bu.log("bench_long_seq: DeepSpeed peer venv not available (benchmarks/peers.py); "
               "running without it")
        args.no_peer = True
    peer = None if args.no_peer else bu.peer_python(create=False)
    result = {"benchmark": "long_seq", "time": bu.now_iso(), "machine": bu.machine(),
              "loadavg_start": bu.loadavg(), "git": bu.git_rev(),
              "versions": {"torch": bu.pkg_version("torch"),
                           "deepspeed": bu.pkg_version("deepspeed", peer) if peer else None},
              "settings": {"seqs": args.seq_list, "ranks": args.rank_list,
                           "model": {"n_layer": args.n_layer, "d_model": args.d_model,
                                     "n_head": args.n_head, "vocab": 256},
                           "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                           "no_dp": args.no_dp,
                           "optimizer": "torch.optim.AdamW lr 1e-4 (both runtimes)",
                           "zero_stage": 1, "backend": "gloo", "omp_threads": 1}}
    for part in args.part_list:
        bu.log(f"== {part}")
        result[part] = PARTS[part](args)
    result["loadavg_end"] = bu.loadavg()
    path = None if args.no_save else bu.save_json(result, "long_seq", Path(args.results_dir))
    print(json.dumps(result, indent=1))
    if path:
        bu.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
