"""Muon step time on CPU: dslaunch's Muon vs DeepSpeed's (peer venv) vs torch.optim.Muon.

    .venv/bin/python benchmarks/bench_muon.py [--dims 256,512] [--rounds 5] [--steps 3]
        [--threads 2] [--no-peer] [--out benchmarks/results/muon-<time>.json]

Method
* For each width d: the hidden matrices of one transformer block, fp32: qkv (3d x d), attention
  out (d x d), MLP up (4d x d), MLP down (d x 4d), all on the Muon side; lr 0.02, momentum 0.95,
  nesterov, 5 Newton-Schulz iterations, no weight decay. Fixed random gradients.
* Contestants: ``dslaunch_gram`` (the default: ns_method gram; the iteration in fp32 on a CPU
  without fp16 matmuls, as DeepSpeed chooses), ``dslaunch_standard`` (ns_method standard forced
  to fp32), ``deepspeed`` (0.19's SingleDeviceMuonWithAuxAdam, ns_method gram, its
  torch.compile'd muon_update, in the peer venv (benchmarks/peers.py), in a worker process
  driven over a pipe so its rounds interleave with ours), ``torch`` (torch.optim.Muon, which
  runs the iteration in bf16), and ``gemm_floor``: only the fp32 matmuls of the standard
  iteration (3 per iteration per matrix) on the same shapes, what a step cannot go below.
* Every contestant warms up first (torch.compile's builds included); in each round each runs
  ``--steps`` timed steps, the round's figure is their median, the reported figure the median
  over rounds; also each one's best round (least disturbed on a shared machine). Ratios:
  contestant / dslaunch_gram (above 1: dslaunch is faster), of the medians and of the best.

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
sys.path.insert(0, str(HERE.parent))

_DS_WORKER = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
import deepspeed
from deepspeed.runtime.zero.muon.original_muon import SingleDeviceMuonWithAuxAdam
opt = None
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "init":
        shapes = json.loads(cmd[1])
        g = torch.Generator().manual_seed(0)
        params = []
        for s in shapes:
            p = torch.nn.Parameter(torch.randn(*s, generator=g) * 0.02)
            p.grad = torch.randn(*s, generator=g)
            params.append(p)
        opt = SingleDeviceMuonWithAuxAdam([dict(params=params, use_muon=True, lr=0.02,
                                                momentum=0.95, weight_decay=0.0, ns_method="gram")])
        for _ in range(3):
            opt.step()
        out({"ok": True, "version": deepspeed.__version__})
    elif cmd[0] == "run":
        times = []
        for _ in range(int(cmd[1])):
            t = time.perf_counter(); opt.step(); times.append(time.perf_counter() - t)
        out({"times": times})
    else:
        break
"""


def shapes_of(d: int) -> list:
    return [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]


class Ours:
    def __init__(self, shapes, method, dtype):
        import torch

        from dslaunch.engine.optim.muon import Muon

        g = torch.Generator().manual_seed(0)
        self.params = []
        for s in shapes:
            p = torch.nn.Parameter(torch.randn(*s, generator=g) * 0.02)
            p.grad = torch.randn(*s, generator=g)
            self.params.append(p)
        self.opt = Muon([dict(params=self.params, use_muon=True, lr=0.02, momentum=0.95,
                              ns_method=method, ns_dtype=dtype)])

    def step(self):
        self.opt.step()


class TorchMuon(Ours):
    def __init__(self, shapes):
        import torch

        super().__init__(shapes, "gram", "auto")
        self.opt = torch.optim.Muon(self.params, lr=0.02, momentum=0.95, weight_decay=0.0)


class GemmFloor:
    def __init__(self, shapes):
        import torch

        self.xs = []
        for r, c in shapes:
            r, c = min(r, c), max(r, c)
            self.xs.append((torch.randn(r, c) / (r * c) ** 0.5, torch.empty(r, r),
                            torch.empty(r, r), torch.empty(r, c)))

    def step(self):
        import torch

        for X, A, B, Y in self.xs:
            for _ in range(5):
                torch.mm(X, X.T, out=A)
                torch.mm(A, A, out=B)
                torch.mm(B, X, out=Y)


class Peer:
    def __init__(self, py, shapes, threads):
        env = dict(os.environ, BENCH_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([py, "-c", _DS_WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.version = self._ask(f"init {json.dumps(shapes).replace(' ', '')}")["version"]

    def _ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        while True:  # DeepSpeed logs to stdout too: the replies are the JSON lines
            reply = self.proc.stdout.readline()
            if not reply:
                raise RuntimeError("the DeepSpeed worker exited")
            if reply.startswith("{"):
                return json.loads(reply)

    def run(self, k):
        return self._ask(f"run {k}")["times"]

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        self.proc.wait(timeout=60)


def local_times(obj, k):
    times = []
    for _ in range(k):
        t = time.perf_counter()
        obj.step()
        times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="256,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from dslaunch.engine.optim.newton_schulz import ns_dtype

    py = None
    if not a.no_peer:
        from peers import peer_python

        py = peer_python(create=False)
    result = {"torch": torch.__version__, "threads": a.threads, "machine": platform.processor()
              or platform.machine(), "rounds": a.rounds, "steps": a.steps,
              "dslaunch_gram_dtype": str(ns_dtype("gram", torch.device("cpu"))), "widths": {}}
    for d in [int(x) for x in a.dims.split(",")]:
        shapes = shapes_of(d)
        local = {"dslaunch_gram": Ours(shapes, "gram", "auto"),
                 "dslaunch_standard": Ours(shapes, "standard", "fp32"),
                 "gemm_floor": GemmFloor(shapes)}
        if hasattr(torch.optim, "Muon"):
            local["torch"] = TorchMuon(shapes)
        for obj in local.values():
            local_times(obj, 2)  # warm-up
        peer = Peer(str(py), shapes, a.threads) if py else None
        rounds = {name: [] for name in [*local, *(["deepspeed"] if peer else [])]}
        for _ in range(a.rounds):
            for name, obj in local.items():
                rounds[name].append(statistics.median(local_times(obj, a.steps)))
            if peer:
                rounds["deepspeed"].append(statistics.median(peer.run(a.steps)))
        if peer:
            result["deepspeed"] = peer.version
            peer.close()
        med = {k: statistics.median(v) for k, v in rounds.items()}
        best = {k: min(v) for k, v in rounds.items()}
        result["widths"][str(d)] = {
            "shapes": shapes, "params": sum(r * c for r, c in shapes),
            "seconds_per_step": med, "rounds": rounds,
            "ratio_to_dslaunch_gram": {k: v / med["dslaunch_gram"] for k, v in med.items()},
            "best_round_seconds": best,
            "ratio_to_dslaunch_gram_best_round": {k: v / best["dslaunch_gram"]
                                                  for k, v in best.items()}}
    text = json.dumps(result, indent=1)
    print(text)
    out = Path(a.out) if a.out else HERE / "results" / f"muon-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
