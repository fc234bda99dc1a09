#!/usr/bin/env python
"""ZeRO++ quantized communication (qwZ, qgZ): loss after N steps and bytes per collective,
against plain ZeRO-3, on 4 CPU ranks made into 2 hosts of 2 (``DSLAUNCH_FAKE_HOSTS=2``).

One ``dslaunch run`` of tests/scripts/zeropp_train.py trains the tiny GPT (examples/gpt.py) from
the same seed on the same data once per config (plain, qwz, qgz, both; fp32 and bf16) and
reports per-step losses and ``engine.comm_stats()``. This file turns that into, per config: the
final loss and its relative difference from plain ZeRO-3 in the same precision (issue 24's target:
within 1% after 200 steps), that of the mean of the last 10 steps' losses, the largest per-step
difference (one batch's loss: the trajectories drift apart step by step), and the bytes each collective was
handed and sent, with the ratio of the parameter all-gather's and the cross-host gradient
traffic's bytes to plain ZeRO-3's. Not a speed benchmark: the ranks share one machine, so every
link is loopback (DeepSpeed 0.19.8 refuses qwZ and qgZ on CPU, so there is no peer to run).

    .venv/bin/python benchmarks/bench_zeropp_quant.py [--steps 200] [--out FILE.json]
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

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = "plain,qwz,qgz,both,plain_bf16,qwz_bf16,qgz_bf16,both_bf16"


def summarize(raw: dict) -> dict:
    runs = raw["runs"]
    out = {}
    for name, r in runs.items():
        ref_name = "plain_bf16" if name.endswith("_bf16") else "plain"
        ref = runs[ref_name]
        losses, base = r["losses"], ref["losses"]
        st, pst = r["stats"], ref["stats"]
        gather = st.get("qwz_all_gather", st.get("all_gather", {}))
        row = {"final_loss": losses[-1], "first_loss": losses[0],
               "final_rel_diff_vs_plain": (losses[-1] - base[-1]) / base[-1],
               "max_step_rel_diff_vs_plain": max(abs(a - b) / b for a, b in zip(losses, base)),
               # one step's loss is one batch's: the mean of the last 10 is the steadier figure
               "last10_mean_rel_diff_vs_plain":
                   (sum(losses[-10:]) - sum(base[-10:])) / sum(base[-10:]),
               "losses": losses,
               "param_all_gather_bytes": gather.get("bytes", 0),
               "param_all_gather_bytes_ratio_vs_plain":
                   gather.get("bytes", 0) / pst["all_gather"]["bytes"],
               "stats": st}
        if "qgz_inter_all_to_all" in st:
            # plain ZeRO-3's cross-host share of its reduce-scatter: the chunks of the other host
            # (half the bucket on 2 hosts), at the gradient dtype
            cross = pst["reduce_scatter"]["bytes"] // 2
            row["grad_cross_host_bytes"] = st["qgz_inter_all_to_all"]["bytes"]
            row["grad_cross_host_bytes_ratio_vs_plain"] = st["qgz_inter_all_to_all"]["bytes"] / cross
        out[name] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = Path(tmp) / "raw.json"
        cmd = [sys.executable, "-c", "import sys; from dslaunch.cli import main; sys.exit(main())",
               "run", "--nproc-per-node", "4", "--omp-threads", "1",
               str(ROOT / "tests" / "scripts" / "zeropp_train.py"), "--steps", str(a.steps),
               "--configs", a.configs, "--out", str(raw_path)]
        env = dict(os.environ, DSLAUNCH_FAKE_HOSTS="2", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        raw = json.loads(raw_path.read_text())
    result = {"benchmark": "zeropp_quant", "steps": a.steps, "ranks": 4, "fake_hosts": 2,
              "model": "examples/gpt.py GPT(seq 32, 2 layers, d_model 32), AdamW lr 3e-3",
              "seconds": round(time.perf_counter() - t0, 1),
              "collectives": raw["collectives"], "configs": summarize(raw)}
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / \
        f"zeropp_quant-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    for name, row in result["configs"].items():
        print(f"{name:12s} final {row['final_loss']:.4f}  vs plain {row['final_rel_diff_vs_plain']:+.3%}"
              f" (last 10 {row['last10_mean_rel_diff_vs_plain']:+.3%})"
              f"  all-gather bytes x{row['param_all_gather_bytes_ratio_vs_plain']:.3f}"
              + (f"  cross-host grad bytes x{row['grad_cross_host_bytes_ratio_vs_plain']:.3f}"
                 if "grad_cross_host_bytes" in row else ""))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
