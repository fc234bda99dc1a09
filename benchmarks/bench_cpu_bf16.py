#!/usr/bin/env python
"""bf16 vs fp32 compute on this CPU: the cost a bf16 job pays on a CPU without native bf16
instructions (avx512_bf16 / amx_bf16), the number dslaunch's bf16-on-CPU warning quotes
(dslaunch/kernels/cpu_features.py: BF16_COST).

Cases, each timed in fp32 and in bf16 (weights and activations bf16, as the engine's bf16 mode
runs the forward and backward), interleaved fp32/bf16 every repeat, median of --repeats:

  matmul   a (tokens x d) @ (d x 4d) product, forward only
  mlp      the example GPT's MLP block (examples/gpt.py at 27M: d_model 512, 4x hidden, GELU)
           on tokens = batch 8 x seq 128, forward + backward

Ratio = bf16 median / fp32 median. JSON to stdout and benchmarks/results/cpu-bf16-<ts>.json,
with the CPU model, its bf16-relevant flags and the thread count.

    .venv/bin/python benchmarks/bench_cpu_bf16.py [--threads 1] [--repeats 5] [--d 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dslaunch.kernels.cpu_features import BF16_FLAGS, cpu_info


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cases(d: int, tokens: int):
    def matmul(dtype):
        a = torch.randn(tokens, d).to(dtype)
        b = torch.randn(d, 4 * d).to(dtype)
        return lambda: a @ b

    def mlp(dtype):
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                    torch.nn.Linear(4 * d, d)).to(dtype)
        x = torch.randn(tokens, d).to(dtype).requires_grad_(True)

        def run():
            block(x).float().square().mean().backward()
        return run

    return {"matmul": matmul, "mlp": mlp}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu = cpu_info()
    out = {"cpu_model": cpu.model, "arch": cpu.arch,
           "bf16_flags_present": sorted(BF16_FLAGS & cpu.flags),
           "bf16_flags_missing": sorted(BF16_FLAGS - cpu.flags),
           "avx2": "avx2" in cpu.flags, "avx512f": "avx512f" in cpu.flags,
           "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
           "d": args.d, "tokens": args.tokens, "cases": {}}
    for name, make in cases(args.d, args.tokens).items():
        fns = {"fp32": make(torch.float32), "bf16": make(torch.bfloat16)}
        for fn in fns.values():  # warm up (first-call allocations, oneDNN primitive creation)
            fn()
        times = {"fp32": [], "bf16": []}
        for r in range(args.repeats):
            order = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
            for dt in order:
                times[dt].append(_time(fns[dt]))
        med = {dt: statistics.median(ts) for dt, ts in times.items()}
        out["cases"][name] = {"fp32_s": med["fp32"], "bf16_s": med["bf16"],
                              "ratio_bf16_over_fp32": med["bf16"] / med["fp32"],
                              "fp32_all_s": times["fp32"], "bf16_all_s": times["bf16"]}
    text = json.dumps(out, indent=1)
    print(text)
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / f"cpu-bf16-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
