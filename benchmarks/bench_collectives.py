"""gloo collectives on CPU: native reduce_scatter / all_gather against the all_reduce emulations.

Why: on gloo, DDP's all_reduce moved the same bytes about twice as fast as ZeRO's reduce_scatter_tensor
and all_gather_into_tensor. This measures, per bucket size, the seconds of each variant on N ranks
(spawned processes, gloo over loopback, OMP_NUM_THREADS=1), interleaved over repeats, medians:

  all_reduce            in-place all_reduce of the whole bucket (DDP's collective)
  reduce_scatter        dist.reduce_scatter_single(chunk_out, bucket)  (gloo's own)
  rs_via_all_reduce     all_reduce of the bucket, then copy this rank's chunk out
  all_gather            dist.all_gather_single(bucket_out, chunk)  (gloo's own)
  ag_via_all_reduce     zero the bucket, copy this rank's chunk in, all_reduce the bucket
  rs_pairwise           dslaunch/engine/comm/pairwise.py: every rank sends chunk j to rank j
                        (isend/irecv, all posted at once), sums the pieces of its own chunk
  ag_pairwise           comm_pairwise.py: every rank sends its chunk to every rank, received
                        straight into the output

Each timed sample is a "pass" over ``total`` elements split in buckets of ``bucket`` elements
(the whole model when bucket == total), timed on rank 0 after a barrier.

    .venv/bin/python benchmarks/bench_collectives.py                   # 2 ranks, 2M buckets + 27.4M whole
    .venv/bin/python benchmarks/bench_collectives.py --nproc 4 --repeats 5

JSON to stdout and benchmarks/results/collectives-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dslaunch.engine.comm import pairwise
from dslaunch.engine.comm.collectives import all_gather_single, reduce_scatter_single

VARIANTS = ("all_reduce", "reduce_scatter", "rs_via_all_reduce", "rs_pairwise", "all_gather",
            "ag_via_all_reduce", "ag_pairwise")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pass(variant, bufs, outs, chunks, rank, world):
    for buf, out, ch in zip(bufs, outs, chunks):
        c = ch.numel()
        if variant == "all_reduce":
            dist.all_reduce(buf)
        elif variant == "reduce_scatter":
            reduce_scatter_single(ch, buf)
        elif variant == "rs_via_all_reduce":
            dist.all_reduce(buf)
            ch.copy_(buf[rank * c:(rank + 1) * c])
        elif variant == "rs_pairwise":
            pairwise.reduce_scatter(ch, buf, None, rank, world)
        elif variant == "ag_pairwise":
            pairwise.all_gather(out, ch, None, rank, world)
        elif variant == "all_gather":
            all_gather_single(out, ch)
        elif variant == "ag_via_all_reduce":
            out.zero_()
            out[rank * c:(rank + 1) * c].copy_(ch)
            dist.all_reduce(out)


def _worker(rank, world, port, cases, repeats, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    res = {}
    for total, bucket in cases:
        sizes = [min(bucket, total - o) for o in range(0, total, bucket)]
        sizes = [s - s % world for s in sizes]
        bufs = [torch.randn(s) for s in sizes]
        outs = [torch.empty(s) for s in sizes]
        chunks = [torch.randn(s // world) for s in sizes]
        key = f"total={total},bucket={bucket}"
        times = {v: [] for v in VARIANTS}
        for v in VARIANTS:  # one untimed pass each
            _pass(v, bufs, outs, chunks, rank, world)
        for _ in range(repeats):
            for v in VARIANTS:  # interleaved
                dist.barrier()
                t0 = time.perf_counter()
                _pass(v, bufs, outs, chunks, rank, world)
                dist.barrier()
                times[v].append(time.perf_counter() - t0)
        res[key] = {"total": total, "bucket": bucket, "buckets": len(sizes),
                    "seconds": {v: times[v] for v in VARIANTS},
                    "median_s": {v: statistics.median(times[v]) for v in VARIANTS}}
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, nargs="+", default=[2])
    ap.add_argument("--total", type=int, default=27_400_000)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1 << 21, 1 << 23, 0],
                    help="bucket sizes in elements (0: the whole total in one)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    out = {"torch": torch.__version__, "backend": "gloo", "repeats": a.repeats,
           "load_before": os.getloadavg(), "runs": {}}
    ctx = mp.get_context("spawn")
    for world in a.nproc:
        q = ctx.Queue()
        cases = [(a.total, b or a.total) for b in a.buckets]
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, world, port, cases, a.repeats, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        res = q.get()
        for p in procs:
            p.join()
        out["runs"][f"world={world}"] = res
        for key, r in res.items():
            m = r["median_s"]
            print(f"world={world} {key} ({r['buckets']} buckets): " + ", ".join(
                f"{v} {m[v]:.3f}s" for v in VARIANTS) +
                f" | rs/ar-path {m['reduce_scatter'] / m['rs_via_all_reduce']:.2f}x"
                f" ag/ar-path {m['all_gather'] / m['ag_via_all_reduce']:.2f}x"
                f" rs pairwise/ar-path {m['rs_pairwise'] / m['rs_via_all_reduce']:.2f}x"
                f" ag pairwise/native {m['ag_pairwise'] / m['all_gather']:.2f}x", file=sys.stderr)
    out["load_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    print(text)
    if not a.no_save:
        os.makedirs(a.results_dir, exist_ok=True)
        path = os.path.join(a.results_dir, time.strftime("collectives-%Y%m%d-%H%M%S.json"))
        with open(path, "w") as f:
            f.write(text + "\n")
        print(f"saved {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
