#!/usr/bin/env python
"""Async I/O op bandwidth vs fio: read and write GB/s at the best tuned setting, same file system.

1. Tune: a small nvme-tune sweep (dslaunch.nvme.tune, in process) on --dir picks the best write
   setting and the best read setting (or pass --block-size/--queue-depth/--threads to skip it).
2. Measure, interleaved, --repeats rounds (the order of op/fio alternates every round):
     op   AsyncIOHandle(best setting).async_pwrite/async_pread + wait of --size bytes between a
          page-aligned buffer and one file (O_DIRECT), timed submit..wait
     fio  fio --ioengine=libaio --direct=1 --bs=<block_size> --iodepth=<queue_depth>
          --numjobs=<intra_op_parallelism> (each job one contiguous 1/T of the file, as the op
          splits it), sequential, the same file, the same --size
   Both overwrite the same preallocated file (no allocating writes) and read it back.
3. Per engine and direction: median GB/s (1e9 bytes/s), ratio op/fio (target >= 0.9).

JSON to stdout and benchmarks/results/aio-<timestamp>.json. The file is removed at the end (also on
Ctrl-C). Bandwidth on a virtual disk is noisy (+-50% run to run): read medians and ratios, not
single runs.

    .venv/bin/python benchmarks/bench_aio.py [--dir /tmp] [--size 512M] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

TUNE_SWEEP = {"block_size": ["256K", "1M"], "queue_depth": [8, 32], "intra_op_parallelism": [1, 2],
              "single_submit": [False], "overlap_events": [True]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="directory for the test file")
    p.add_argument("--size", default="512M", help="bytes per run (e.g. 256M, 1G)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds")
    p.add_argument("--tune-size", default="256M", help="bytes per trial of the tuning sweep")
    p.add_argument("--tune-loops", type=int, default=2)
    p.add_argument("--block-size", help="skip tuning: use this block size (with the two below)")
    p.add_argument("--queue-depth", type=int)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if (args.block_size is None) != (args.queue_depth is None):
        p.error("--block-size and --queue-depth go together")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def fio_cmd(path, rw: str, size: int, cfg: dict) -> list[str]:
    """fio with the op's block size, queue depth, threads (numjobs, each a contiguous 1/T of the
    file) and submission mode (batched submits unless single_submit; reap from 1 completion when
    overlap_events, else the whole batch)."""
    jobs, qd = cfg["intra_op_parallelism"], cfg["queue_depth"]
    per = size // jobs
    return ["fio", "--name=bench", f"--filename={path}", f"--rw={rw}", f"--bs={cfg['block_size']}",
            "--direct=1", "--ioengine=libaio", f"--iodepth={qd}",
            f"--iodepth_batch_submit={1 if cfg['single_submit'] else qd}",
            f"--iodepth_batch_complete_min={1 if cfg['overlap_events'] else qd}",
            f"--numjobs={jobs}", f"--size={per}", f"--offset_increment={per}", "--group_reporting",
            "--output-format=json"]


def fio_gbps(path: Path, rw: str, size: int, cfg: dict) -> float:
    """One fio run (fio_cmd); GB/s (1e9 B/s)."""
    cmd = fio_cmd(path, rw, size, cfg)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0][rw]
    return job["io_bytes"] / (job["runtime"] / 1e3) / 1e9  # runtime in ms


def op_gbps(handle, buf, path: Path, rw: str) -> float:
    start = time.perf_counter()
    (handle.async_pread if rw == "read" else handle.async_pwrite)(buf, path)
    handle.wait()
    return buf.numel() / (time.perf_counter() - start) / 1e9


def tune_best(directory: Path, tune_size: int, loops: int) -> dict:
    from dslaunch.nvme import tune

    targets = tune.check_dirs([directory], tune_size)
    sweep_cfg = tune.normalize_sweep(TUNE_SWEEP)
    with tune.Sweep(targets, tune_size, tune.grid(sweep_cfg), ("write", "read"), loops) as sweep:
        sweep.prepare()
        sweep.run(lambda t, done, total: bu.log(
            f"  tune {done}/{total} {t.op} {t.config} {t.gbps:.2f} GB/s"))
        summary = tune.summary(sweep)
    return {op: {k: summary["best"][op][k] for k in tune.KEYS} | {"tune_gbps": summary["best"][op]["gbps"]}
            for op in ("write", "read")} | {"sweep": TUNE_SWEEP, "tune_size": tune_size, "loops": loops}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from dslaunch.nvme import aio, tune

    if shutil.which("fio") is None:
        print("bench_aio: fio not found (apt-get install fio)", file=sys.stderr)
        return 1
    size = tune.parse_size(args.size)
    size -= size % aio.ALIGN
    directory = Path(args.dir).resolve()
    tune.check_dirs([directory], size)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))

    if args.block_size:
        fixed = {"block_size": tune.parse_size(args.block_size), "queue_depth": args.queue_depth,
                 "intra_op_parallelism": args.threads, "single_submit": False, "overlap_events": True}
        best = {"write": dict(fixed), "read": dict(fixed), "sweep": None}
    else:
        bu.log(f"tuning on {directory} ({args.tune_size} per trial)")
        best = tune_best(directory, tune.parse_size(args.tune_size), args.tune_loops)

    work = Path(tempfile.mkdtemp(prefix=".dslaunch-bench-aio.", dir=directory))
    runs = {f"{eng}_{rw}": [] for eng in ("op", "fio") for rw in ("write", "read")}
    try:
        path = work / "data.bin"
        handles = {rw: aio.AsyncIOHandle(**{k: best[rw][k] for k in tune.KEYS}) for rw in ("write", "read")}
        buf = handles["write"].new_cpu_locked_tensor(size, torch.uint8)
        buf.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))
        handles["write"].sync_pwrite(buf, path)  # lay the file out: later writes overwrite
        io_mode = handles["write"].io_mode(work)
        for r in range(args.repeats):
            order = ("op", "fio") if r % 2 == 0 else ("fio", "op")
            for rw in ("write", "read"):
                for eng in order:
                    gbps = (op_gbps(handles[rw], buf, path, rw) if eng == "op"
                            else fio_gbps(path, rw, size, best[rw]))
                    runs[f"{eng}_{rw}"].append(round(gbps, 4))
                    bu.log(f"round {r + 1}/{args.repeats} {eng:3s} {rw:5s} {gbps:6.2f} GB/s")
        stats = {h: handles[h].stats() for h in handles}
        backend = handles["read"].backend
        for h in handles.values():
            h.close()
    except KeyboardInterrupt:
        bu.log("bench_aio: interrupted; files removed")
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: bu.median(v) for k, v in runs.items()}
    result = {
        "benchmark": "aio",
        "time": bu.now_iso(),
        "dir": str(directory),
        "filesystem": subprocess.run(["df", "-T", str(directory)], capture_output=True,
                                     text=True).stdout.splitlines()[-1].split()[:2],
        "io_mode": io_mode,
        "backend": backend,
        "size_bytes": size,
        "repeats": args.repeats,
        "config": best,
        "fio": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
        "fio_commands": {rw: " ".join(fio_cmd("FILE", rw, size, best[rw])) for rw in ("write", "read")},
        "gbps_runs": runs,
        "gbps_median": {k: round(v, 4) for k, v in med.items()},
        "ratio_op_over_fio": {rw: bu.ratio(med[f"op_{rw}"], med[f"fio_{rw}"]) for rw in ("write", "read")},
        "target_ratio": 0.9,
        "op_stats": stats,
        "machine": bu.machine(),
        "loadavg": bu.loadavg(),
        "git": bu.git_rev(),
    }
    result["target_met"] = {rw: (result["ratio_op_over_fio"][rw] or 0) >= 0.9 for rw in ("write", "read")}
    path = None if args.no_save else bu.save_json(result, "aio", Path(args.results_dir))
    if path:
        bu.log(f"saved {path}")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
