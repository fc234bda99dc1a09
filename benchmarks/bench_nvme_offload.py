#!/usr/bin/env python
"""ZeRO stage 3 with the optimizer (or the parameters) offloaded to the CPU vs to NVMe: step time,
peak RSS, swap I/O.

The bench GPT of examples/gpt.py (bench_config: 6 layers, hidden 512, vocab 8192, seq 128, 27.4M
parameters), fp32, AdamW, 2 ranks through ``dslaunch run`` (tests/scripts/nvme_train.py
--bench), --rounds interleaved rounds (the order of the two alternates every round):

    cpu   zero_optimization.offload_optimizer.device = cpu
    nvme  the same with device = nvme under --dir (sub_group_size / buffer_count / aio as given)

With ``--target param`` both runs offload the optimizer to the CPU and compare
``offload_param.device`` cpu with nvme (``max_in_cpu: 0``: every parameter shard on the drive,
``--param-buffer-count`` buffers); the nvme side then reports the parameter swap's bytes per step
and how many of its reads were started ahead (``read_ahead_used`` / ``reads``).

Per configuration: median step time over the steps after --warmup (all rounds pooled), the ranks'
peak RSS (max over ranks, median over rounds), the optimizer bytes memory_breakdown() reports by
device, and for nvme the swap I/O per step (read + write bytes), the optimizer step's wall time
(swap + Adam), the time blocked waiting for I/O, and the swap rate: bytes moved per second of
optimizer step. Both runs set glibc's MALLOC_MMAP_THRESHOLD_ (--mmap-threshold, 0 = leave it
dynamic) so that freed blocks go back to the OS and RSS shows what the process holds.

JSON to stdout and benchmarks/results/nvme_offload-<timestamp>.json.

    .venv/bin/python benchmarks/bench_nvme_offload.py [--dir /tmp] [--rounds 3] [--steps 6]
        [--target optimizer|param]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

SCRIPT = bu.REPO / "tests" / "scripts" / "nvme_train.py"
DSLAUNCH = Path(sys.executable).with_name("dslaunch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="nvme_path (a directory)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the timings")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--sub-group-size", type=float, default=1e6)
    p.add_argument("--buffer-count", type=int, default=4)
    p.add_argument("--block-size", default="1M")
    p.add_argument("--queue-depth", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="aio intra_op_parallelism")
    p.add_argument("--mmap-threshold", type=int, default=131072)
    p.add_argument("--target", choices=("optimizer", "param"), default="optimizer",
                   help="what goes to NVMe on the nvme side")
    p.add_argument("--param-buffer-count", type=int, default=3)
    p.add_argument("--prefetch-bucket-size", type=float, default=None,
                   help="stage3_prefetch_bucket_size on both sides (default: DeepSpeed's 5e7, "
                        "which prefetches this whole model at once: nothing left to read ahead)")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error("--steps must be larger than --warmup")
    return args


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def config(args, device: str, swap_root: Path) -> dict:
    off = {"device": device}
    zero = {}
    if args.target == "param":
        param = {"device": device}
        if device == "nvme":
            param.update(nvme_path=str(swap_root), buffer_count=args.param_buffer_count,
                         max_in_cpu=0)
        off, zero = {"device": "cpu"}, {"offload_param": param}
    if args.prefetch_bucket_size is not None:
        zero["stage3_prefetch_bucket_size"] = int(args.prefetch_bucket_size)
    elif device == "nvme":
        off.update(nvme_path=str(swap_root), buffer_count=args.buffer_count)
    return {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
            "gradient_clipping": 1.0, "steps_per_print": 1000,
            "aio": {"block_size": _bytes(args.block_size), "queue_depth": args.queue_depth,
                    "intra_op_parallelism": args.threads},
            "zero_optimization": {"stage": 3, "sub_group_size": int(args.sub_group_size),
                                  "offload_optimizer": off, **zero}}


def run_one(args, device: str, work: Path, tag: str) -> dict:
    swap_root = work / f"swap_{tag}"
    swap_root.mkdir()
    cfg = work / f"{tag}.json"
    cfg.write_text(json.dumps(config(args, device, swap_root)))
    out = work / f"{tag}.out.json"
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // args.nproc)))
    if args.mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    cmd = [str(DSLAUNCH), "run", "--nproc-per-node", str(args.nproc), "--config", str(cfg),
           str(SCRIPT), "--bench", "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch", str(args.micro_batch * args.nproc), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=bu.REPO)
    if p.returncode != 0:
        raise SystemExit(f"{tag} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    res = json.loads(out.read_text())
    left = list(swap_root.iterdir())
    shutil.rmtree(swap_root, ignore_errors=True)
    res["swap_left_behind"] = [str(x) for x in left]
    return res


def summarize(args, runs: list) -> dict:
    times = [t for r in runs for k, t in r["step_seconds"].items() if int(k) >= args.warmup]
    r0 = runs[0]["ranks"][0]
    out = {"step_seconds_median": bu.median(times), "step_seconds": times,
           "peak_rss_bytes_median": bu.median([max(x["peak_rss"] for x in r["ranks"]) for r in runs]),
           "peak_rss_bytes_per_round": [[x["peak_rss"] for x in r["ranks"]] for r in runs],
           "memory_breakdown_rank0": r0["memory"],
           "final_loss": [r["losses"][str(args.steps - 1)] for r in runs],
           "swap_left_behind": sum(len(r["swap_left_behind"]) for r in runs)}
    if r0["swap"]:
        steps = args.steps - args.warmup
        per = [x["swap"]["after_warmup"] for r in runs for x in r["ranks"]]
        io = bu.median([(w["read_bytes"] + w["write_bytes"]) / steps for w in per])
        opt = bu.median([w["step_seconds"] / steps for w in per])
        wait = bu.median([w["io_wait_seconds"] / steps for w in per])
        sw = r0["swap"]
        out["swap"] = {"backend": sw["backend"], "io_mode": sw["io_mode"],
                       "file_bytes_per_rank": sw["file_bytes"], "buffers": sw["buffers"],
                       "buffer_bytes_per_rank": sw["buffer_bytes"], "subgroups": sw["subgroups"],
                       "io_bytes_per_step_per_rank": io,
                       "optimizer_step_seconds": opt, "io_wait_seconds_per_step": wait,
                       "swap_gbps_per_rank": io / opt / 1e9 if opt else None,
                       "swap_gbps_both_ranks": args.nproc * io / opt / 1e9 if opt else None}
    if r0.get("param_swap"):
        ps = [x["param_swap"] for r in runs for x in r["ranks"]]
        out["param_swap"] = {
            "backend": ps[0]["backend"], "file_bytes_per_rank": ps[0]["file_bytes"],
            "buffers": ps[0]["buffers"], "buffer_bytes_per_rank": ps[0]["buffer_bytes"],
            "io_bytes_per_step_per_rank": bu.median(
                [(x["read_bytes"] + x["write_bytes"]) / args.steps for x in ps]),
            "reads_started_ahead": bu.median([x["read_ahead_used"] / max(1, x["reads"])
                                              for x in ps]),
            "io_wait_seconds_per_step": bu.median([x.get("io_wait_seconds", 0.0) / args.steps
                                                   for x in ps])}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_nvme_", dir=args.dir))
    runs: dict = {"cpu": [], "nvme": []}
    loads = [bu.loadavg()]
    try:
        for rnd in range(args.rounds):
            order = ("cpu", "nvme") if rnd % 2 == 0 else ("nvme", "cpu")
            for device in order:
                bu.log(f"round {rnd + 1}/{args.rounds}: {device}")
                runs[device].append(run_one(args, device, work, f"{device}{rnd}"))
            loads.append(bu.loadavg())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu, nvme = summarize(args, runs["cpu"]), summarize(args, runs["nvme"])
    result = {
        "benchmark": "nvme_offload", "time": bu.now_iso(), "machine": bu.machine(),
        "git": bu.git_rev(), "loadavg": loads, "dir": args.dir,
        "setup": {"model": "examples/gpt.py bench_config (27.4M params)", "stage": 3,
                  "target": args.target,
                  "stage3_prefetch_bucket_size": args.prefetch_bucket_size,
                  "precision": "fp32", "nproc": args.nproc, "micro_batch": args.micro_batch,
                  "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                  "sub_group_size": int(args.sub_group_size), "buffer_count": args.buffer_count,
                  "aio": config(args, "nvme", Path(args.dir))["aio"],
                  "MALLOC_MMAP_THRESHOLD_": args.mmap_threshold or None},
        "cpu": cpu, "nvme": nvme,
        "same_losses": [a["losses"] == b["losses"] for a, b in zip(runs["cpu"], runs["nvme"])],
        "ratios": {"step_time_nvme_over_cpu": bu.ratio(nvme["step_seconds_median"],
                                                       cpu["step_seconds_median"]),
                   "peak_rss_saved_bytes": cpu["peak_rss_bytes_median"] - nvme["peak_rss_bytes_median"],
                   "peak_rss_nvme_over_cpu": bu.ratio(nvme["peak_rss_bytes_median"],
                                                      cpu["peak_rss_bytes_median"])},
    }
    path = None if args.no_save else bu.save_json(result, "nvme_offload", Path(args.results_dir))
    print(json.dumps(result, indent=1))
    if path:
        bu.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
