"""CPU Adam step: dslaunch's compiled op vs torch.optim.Adam (fused, foreach) vs DeepSpeed's
DeepSpeedCPUAdam, plus the machine's memory bandwidth, all in one run.

    .venv/bin/python benchmarks/bench_cpu_adam.py [--sizes 10M,50M,100M] [--rounds 5] [--steps 5]
        [--threads 2] [--no-peer] [--out benchmarks/results/cpu_adam.json]

Method
* One flat fp32 parameter of each size, lr 1e-3, Adam without weight decay (the same update for
  every contestant). Each contestant has its own param/exp_avg/exp_avg_sq; the gradient tensor is
  shared (all contestants only read it). Every contestant runs warm-up steps first (page faults,
  DeepSpeed's JIT build), then in each round A B C D ... (interleaved, compared pairs back to
  back) `--steps` timed steps; a round's figure is the median step, the reported figure the median
  over rounds. Ratios (peer time / dslaunch time) come three ways: of the medians
  (`dslaunch_speedup`), median of the per-round ratios (`_paired`: load drifts cancel), and of
  the best rounds (`_best_round`: least disturbed by other work on a shared machine).
* DeepSpeed runs in its own venv (benchmarks/peers.py) in a worker process driven over a pipe, so
  its rounds interleave with ours; same thread count (OMP_NUM_THREADS and torch threads).
* Effective GB/s = 28 bytes/param / seconds per step (read p, g, m, v; write p, m, v).
* Bandwidth: STREAM-style copy (a = b, 8 B/elem), triad (a = b + s*c, 12 B/elem) and read
  (sum a, 4 B/elem) from the cpu_membw op (C++, SIMD, OpenMP static split, same threads) on
  3 x 100M-float arrays, sampled in every round between the contestants; and adam_traffic
  (a += d, b += d, c += d: Adam's four read and three write streams, 28 B/elem, no arithmetic)
  on 4 more arrays, the ceiling an Adam step can reach with these threads. With 1-2 threads the
  one- and two-stream probes are bound by the misses a stream keeps in flight and read below it.
* Offload form (ZeRO-Offload's step): fp32 master + bf16 grad in, bf16 model copy out. dslaunch
  does it in one pass (adam_step(copy_out=...)); the reference is what a runtime does without it:
  grad.float(), torch fused Adam, copy to bf16.

Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BYTES_PER_PARAM = 28

# Runs inside the peer venv: builds DeepSpeedCPUAdam on a flat parameter, then serves
# "init N" / "run K" / "quit" lines on stdin with one JSON line each on stdout.
_DS_WORKER = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
from deepspeed.ops.adam import DeepSpeedCPUAdam
import deepspeed
state = {}
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "init":
        state.clear()
        n = int(arg[0])
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(n, generator=g))
        p.grad = torch.randn(n, generator=g)
        opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                               adamw_mode=True)
        t = time.perf_counter()
        for _ in range(3):
            opt.step()
        state.update(p=p, opt=opt)
        out({"ok": True, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
             "warmup_s": time.perf_counter() - t})
    elif cmd == "run":
        times = []
        for _ in range(int(arg[0])):
            t = time.perf_counter(); state["opt"].step(); times.append(time.perf_counter() - t)
        out({"times": times})
    elif cmd == "quit":
        break
"""


class DeepSpeedPeer:
    def __init__(self, python: str, threads: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), BENCH_THREADS=str(threads),
                   DS_BUILD_OPS="0", PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([python, "-c", _DS_WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd="/tmp")
        self.info = {}

    def _ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        while True:
            reply = self.proc.stdout.readline()
            if not reply:
                raise RuntimeError("DeepSpeed worker died: " + self.proc.stderr.read()[-3000:])
            if reply.startswith("{"):
                return json.loads(reply)

    def init(self, n: int) -> None:
        self.info = self._ask(f"init {n}")

    def run(self, steps: int) -> list[float]:
        return self._ask(f"run {steps}")["times"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMG")) * mult)


def _timed(fn, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def make_contestants(n: int, grad, with_offload: bool):
    """name -> step callable (state captured), for the in-process contestants."""
    import torch

    from dslaunch.kernels import cpu_optim, load_op

    if load_op("cpu_adam") is None:
        raise SystemExit("dslaunch cpu_adam op unavailable: " + str(
            __import__("dslaunch.kernels.builder", fromlist=["x"]).failure_reason("cpu_adam")))
    gen = torch.Generator().manual_seed(0)
    out = {}

    p, m, v = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
    step = [0]

    def ours():
        step[0] += 1
        cpu_optim.adam_step(p, grad, m, v, step=step[0], lr=1e-3)

    out["dslaunch"] = ours
    for kind in ("fused", "foreach"):
        tp = torch.nn.Parameter(torch.randn(n, generator=gen))
        tp.grad = grad
        opt = torch.optim.Adam([tp], lr=1e-3, **{kind: True})
        out[f"torch_{kind}"] = opt.step
    if with_offload:
        master, mo, vo = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
        g16, copy16 = grad.bfloat16(), torch.empty(n, dtype=torch.bfloat16)
        ostep = [0]

        def ours_offload():
            ostep[0] += 1
            cpu_optim.adam_step(master, g16, mo, vo, step=ostep[0], lr=1e-3, copy_out=copy16)

        tp = torch.nn.Parameter(torch.randn(n, generator=gen))
        topt = torch.optim.Adam([tp], lr=1e-3, fused=True)
        tcopy = torch.empty(n, dtype=torch.bfloat16)

        def torch_offload():
            tp.grad = g16.float()
            topt.step()
            tcopy.copy_(tp.detach())

        out["offload_dslaunch_fused"] = ours_offload
        out["offload_torch_unfused"] = torch_offload
    return out


def bandwidth_contestants(n: int, threads: int):
    """STREAM-style probes from the cpu_membw op (SIMD + OpenMP static split, same threads)."""
    import torch

    from dslaunch.kernels import load_op

    op = load_op("cpu_membw")
    if op is None:
        raise SystemExit("dslaunch cpu_membw op unavailable (see the warning above)")
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    a.copy_(b)
    # adam_traffic's own arrays: it adds d into them every call (d tiny, so no overflow)
    t1, t2, t3, d = torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.full((n,), 1e-9)
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
    pt = (t1.data_ptr(), t2.data_ptr(), t3.data_ptr(), d.data_ptr())
    return {"bw_copy": lambda: op.copy(pa, pb, n, threads),
            "bw_triad": lambda: op.triad(pa, pb, pc, 3.0, n, threads),
            "bw_read": lambda: op.read(pb, n, threads),
            "bw_adam_traffic": lambda: op.adam_traffic(*pt, n, threads)}, (a, b, c, t1, t2, t3, d)


BW_BYTES = {"bw_copy": 8, "bw_triad": 12, "bw_read": 4, "bw_adam_traffic": BYTES_PER_PARAM}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10M,50M,100M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per contestant per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bw-size", default="100M", help="floats per bandwidth array")
    ap.add_argument("--no-peer", action="store_true", help="skip DeepSpeed")
    ap.add_argument("--no-offload", action="store_true", help="skip the offload-form pair")
    ap.add_argument("--out", default=str(HERE / "results" / "cpu_adam.json"))
    args = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from dslaunch.kernels import cpu_features, load_op

    peer = None
    peer_note = "skipped (--no-peer)"
    if not args.no_peer:
        from peers import peer_python

        py = peer_python(create=True)
        if py is None:
            peer_note = "DeepSpeed venv could not be created (see stderr)"
        else:
            peer = DeepSpeedPeer(py, args.threads)
            peer_note = "ok"

    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    results = {"sizes": {}}
    bw, _bw_arrays = bandwidth_contestants(_parse_size(args.bw_size), args.threads)
    bw_rounds = {k: [] for k in bw}
    for fn in bw.values():
        _timed(fn, 2)
    for n in sizes:
        grad = torch.randn(n, generator=torch.Generator().manual_seed(1))
        contestants = make_contestants(n, grad, with_offload=not args.no_offload)
        for fn in contestants.values():  # warm-up: page faults, first steps
            _timed(fn, 3)
        if peer is not None:
            peer.init(n)
        # order within a round: each pair that is compared runs back to back (ours, then peers)
        runners = {name: (lambda fn=fn: _timed(fn, args.steps)) for name, fn in contestants.items()}
        if peer is not None:
            runners["deepspeed_cpu_adam"] = lambda: peer.run(args.steps)
        order = [k for k in ("dslaunch", "torch_fused", "deepspeed_cpu_adam",
                             "offload_dslaunch_fused", "offload_torch_unfused", "torch_foreach")
                 if k in runners]
        rounds = {k: [] for k in order}
        for _ in range(args.rounds):
            for name in order:
                rounds[name].append(statistics.median(runners[name]()))
            for name, fn in bw.items():  # bandwidth sampled under the same conditions
                bw_rounds[name].append(statistics.median(_timed(fn, 3)))
        entry = {}
        for name, rs in rounds.items():
            sec = statistics.median(rs)
            entry[name] = {"seconds_per_step": sec, "best_round_seconds": min(rs), "rounds": rs,
                           "effective_GBps_28B": BYTES_PER_PARAM * n / sec / 1e9}
        # speedup = peer time / dslaunch time, on medians (the headline) and on best rounds (the
        # least disturbed by other load on a shared machine)
        pairs = [(k, "dslaunch") for k in entry if k != "dslaunch" and not k.startswith("offload")]
        if "offload_dslaunch_fused" in entry:
            pairs.append(("offload_torch_unfused", "offload_dslaunch_fused"))
        for peer_name, ours_name in pairs:
            entry[peer_name]["dslaunch_speedup"] = (entry[peer_name]["seconds_per_step"]
                                                    / entry[ours_name]["seconds_per_step"])
            entry[peer_name]["dslaunch_speedup_best_round"] = (
                entry[peer_name]["best_round_seconds"] / entry[ours_name]["best_round_seconds"])
            # median of per-round ratios: the two ran seconds apart, so slow drifts of the
            # machine's load cancel
            entry[peer_name]["dslaunch_speedup_paired"] = statistics.median(
                a / b for a, b in zip(rounds[peer_name], rounds[ours_name]))
        ours = entry["dslaunch"]["seconds_per_step"]
        peers_ = [k for k in ("torch_fused", "deepspeed_cpu_adam") if k in entry]
        entry["speedup_vs_best_of_fused_and_deepspeed"] = min(
            entry[k]["seconds_per_step"] for k in peers_) / ours
        entry["speedup_vs_best_of_fused_and_deepspeed_paired"] = min(
            entry[k]["dslaunch_speedup_paired"] for k in peers_)
        entry["speedup_vs_best_of_fused_and_deepspeed_best_round"] = min(
            entry[k]["best_round_seconds"] for k in peers_) / entry["dslaunch"]["best_round_seconds"]
        results["sizes"][str(n)] = entry
        del contestants, grad
        print(f"{n:>11,d} params: " + "  ".join(
            f"{k} {v['seconds_per_step'] * 1e3:.2f} ms" for k, v in entry.items()
            if isinstance(v, dict)), file=sys.stderr)

    bw_n = _parse_size(args.bw_size)
    results["bandwidth"] = {
        name: {"GBps": BW_BYTES[name] * bw_n / statistics.median(rs) / 1e9,
               "bytes_per_elem_counted": BW_BYTES[name], "array_floats": bw_n,
               "rounds_GBps": [BW_BYTES[name] * bw_n / r / 1e9 for r in rs]}
        for name, rs in bw_rounds.items()}
    tri = results["bandwidth"]["bw_triad"]
    triad = tri["GBps"]
    # STREAM does not count the write-allocate read of the destination; Adam has none (every line
    # it writes it has just read), so the like-for-like traffic figure for triad is 16 B/elem
    tri["GBps_with_write_allocate_16B"] = triad * 16 / 12
    adam_ceiling = results["bandwidth"]["bw_adam_traffic"]["GBps"]
    for entry in results["sizes"].values():
        gbps = entry["dslaunch"]["effective_GBps_28B"]
        entry["dslaunch_fraction_of_triad"] = gbps / triad
        entry["dslaunch_fraction_of_triad_16B"] = gbps / tri["GBps_with_write_allocate_16B"]
        entry["dslaunch_fraction_of_adam_traffic"] = gbps / adam_ceiling
    info = cpu_features.cpu_info()
    results["machine"] = {
        "cpu": info.model, "cores": os.cpu_count(), "threads": args.threads,
        "simd": load_op("cpu_adam").simd_level(), "cpu_flags": info.interesting_flags,
        "torch": torch.__version__, "python": platform.python_version(),
        "loadavg_start_end": None,
    }
    results["peer"] = {"status": peer_note, **(peer.info if peer else {})}
    results["method"] = {"rounds": args.rounds, "steps_per_round": args.steps,
                         "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
                         "bytes_per_param": BYTES_PER_PARAM,
                         "bandwidth": "cpu_membw op (cpp/cpu/cpu_membw.cpp): copy a=b (8 B/elem), "
                                      "triad a=b+s*c (12 B/elem), read sum(a) (4 B/elem), STREAM "
                                      "counting (no write-allocate), OpenMP static split, same "
                                      "threads, 3 arrays of bw-size floats, sampled in every round; "
                                      "adam_traffic a+=d, b+=d, c+=d (28 B/elem, Adam's streams "
                                      "without its arithmetic: the ceiling for an Adam step) on 4 "
                                      "more arrays"}
    results["machine"]["loadavg_start_end"] = os.getloadavg()
    if peer is not None:
        peer.close()
    text = json.dumps(results, indent=1)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
