"""Sparse attention on the CPU: tokens/s (forward + backward) and peak memory of
``deepspeed.ops.sparse_attention.SparseSelfAttention`` (dslaunch's, only the kept blocks
computed) against dense attention, at 4k-16k tokens, with a Fixed layout about 1/8 dense.

    .venv/bin/python benchmarks/bench_sparse_attention.py [--seqs 4096,8192,16384]
        [--heads 2] [--head-dim 64] [--block 16] [--impls sparse,dense_math,dense_sdpa]

Each (implementation, length) runs in a fresh process (so its peak is its own): inputs
[1, heads, seq, head_dim] fp32, one untimed warm-up at 1024 tokens, then one forward + backward
at the length, timed. Memory: the process's peak RSS (VmHWM, reset after the inputs are made)
minus its RSS with the inputs made; glibc's mmap threshold is set to 128 KiB so freed blocks
go back. Implementations: ``sparse`` (SparseSelfAttention, bidirectional Fixed layout, its
num_local_blocks, a power of two, chosen per length so the layout is closest to 1/8 dense; the density is
reported), ``dense_math`` (softmax(q k^T / sqrt(d)) v with the seq x seq scores materialised:
DeepSpeed's and BERT's dense attention), ``dense_sdpa`` (torch's scaled_dot_product_attention,
whose CPU kernel is a fused flash-attention that never holds the seq x seq matrix).

JSON to benchmarks/results/sparse_attention-<timestamp>.json. Seconds depend on the machine's
load (recorded: the load average before and after); the memory figures do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def fixed_config(heads: int, block: int, seq: int, target: float = 1 / 8):
    """The bidirectional Fixed layout whose density is closest to ``target`` at ``seq``."""
    from dslaunch.ops.sparse_attention import FixedSparsityConfig

    best = None
    local = 2
    while local <= seq // block // 2:  # powers of two: windows align with the row groups
        cfg = FixedSparsityConfig(heads, block=block, num_local_blocks=local)
        density = float(cfg.make_layout(seq)[0].float().mean())
        if best is None or abs(density - target) < abs(best[1] - target):
            best = (cfg, density, local)
        local *= 2
    return best


def child(args) -> dict:
    import torch

    torch.manual_seed(0)
    H, D, L, block = args.heads, args.head_dim, args.seq, args.block
    density, local = 1.0, None
    if args.impl == "sparse":
        from dslaunch.ops.sparse_attention import SparseSelfAttention

        cfg, density, local = fixed_config(H, block, L)
        module = SparseSelfAttention(cfg, max_seq_length=L)

        def attend(q, k, v):
            return module(q, k, v)
    elif args.impl == "dense_math":
        def attend(q, k, v):
            scores = torch.matmul(q, k.transpose(-1, -2)) * D ** -0.5
            return torch.matmul(torch.softmax(scores, -1), v)
    else:
        def attend(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def step(n):
        q, k, v = (torch.randn(1, H, n, D, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, H, n, D)
        return q, k, v, grad

    q, k, v, grad = step(1024)  # warm-up (smaller layout for sparse: its corner)
    attend(q, k, v).backward(grad)
    q, k, v, grad = step(L)
    base = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    out = attend(q, k, v)
    t1 = time.perf_counter()
    out.backward(grad)
    t2 = time.perf_counter()
    peak = _rss_kb("VmHWM")
    return {"impl": args.impl, "seq": L, "heads": H, "head_dim": D, "block": block,
            "density": round(density, 4), "num_local_blocks": local,
            "forward_s": round(t1 - t0, 3), "backward_s": round(t2 - t1, 3),
            "tokens_per_s": round(L / (t2 - t0), 1),
            "peak_mb": round((peak - base) / 1024, 1), "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="4096,8192,16384")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--impls", default="sparse,dense_sdpa,dense_math")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    load_before = os.getloadavg()
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    for seq in [int(s) for s in args.seqs.split(",")]:
        for impl in args.impls.split(","):
            cmd = [sys.executable, __file__, "--child", "--impl", impl, "--seq", str(seq),
                   "--heads", str(args.heads), "--head-dim", str(args.head_dim),
                   "--block", str(args.block)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                row = {"impl": impl, "seq": seq, "error": done.stderr.strip()[-500:]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows.append(row)
    by = {(r["impl"], r["seq"]): r for r in rows if "error" not in r}
    summary = []
    for seq in sorted({r["seq"] for r in rows}):
        sparse = by.get(("sparse", seq))
        for dense in ("dense_math", "dense_sdpa"):
            other = by.get((dense, seq))
            if sparse and other:
                summary.append({"seq": seq, "vs": dense,
                                "speedup": round(sparse["tokens_per_s"] / other["tokens_per_s"], 2),
                                "memory_ratio": round(other["peak_mb"] / max(sparse["peak_mb"], 0.1), 2)})
    result = {"benchmark": "sparse_attention", "rows": rows, "summary": summary,
              "load_before": load_before, "load_after": os.getloadavg(),
              "cpus": os.cpu_count(), "note": "fp32, batch 1, one forward + backward per row"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sparse_attention-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for s in summary:
        print(f"{s['seq']:>6} tokens vs {s['vs']}: {s['speedup']}x tokens/s, "
              f"{s['memory_ratio']}x less peak memory")
    print(path)


if __name__ == "__main__":
    main()
