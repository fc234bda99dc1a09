"""One MoE layer's forward + backward, by dispatch: capacity 1.25, dropless padded, dropless ragged.

Why: bench_moe.py measured dropless training at 0.86x the tokens/s of capacity factor 1.25. This
isolates the layer: 2 ranks (spawned processes, gloo over loopback, OMP_NUM_THREADS=1), EP 2,
4 experts of examples/gpt.py's MLP shape (d, 4d, d), top-1, ``--tokens`` tokens per rank, a gate
skewed so the experts' loads are uneven as a trained router's are (``--skew``), the same tokens
and weights for every variant:

  capacity_1.25     drop_tokens=True, capacity factor 1.25: [E, C, d] buffers, drops
  dropless_padded   drop_tokens=False, every expert's buffer padded to the busiest expert's count
                    over the group (an all-reduce of that count first): DeepSpeed's dispatch
  dropless_ragged   drop_tokens=False, dslaunch/engine/parallel/moe/ragged.py: per-expert counts
                    exchanged, then exactly the routed tokens; each expert on its own rows

Per variant, over ``--blocks`` blocks of ``--iters`` iterations (variants alternated per block),
each iteration after a barrier: wall milliseconds (20th percentile and median: the machine may be
shared, the low percentile is the least disturbed), the main thread's CPU milliseconds, the
all-to-all bytes per iteration (the ep group's comm statistics) and the rows the experts ran on
(this rank). Ratios: capacity_1.25's time / the variant's (> 1: faster than capacity 1.25).

    .venv/bin/python benchmarks/bench_moe_dispatch.py [--blocks 12] [--iters 10] [--skew 0.5]

JSON to benchmarks/results/moe_dispatch-<timestamp>.json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import benchutil as bu

VARIANTS = ("capacity_1.25", "dropless_padded", "dropless_ragged")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--iters", type=int, default=10, help="iterations per block")
    p.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--skew", type=float, default=0.5,
                   help="gate bias towards expert 0 (0: random routing)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(nn.functional.gelu(self.fc(x)))


def _layer(variant, d, skew):
    from dslaunch.moe.layer import MoE

    torch.manual_seed(0)
    moe = MoE(d, MLP(d), num_experts=4, ep_size=2, k=1,
              capacity_factor=1.25 if variant == "capacity_1.25" else 1.0, min_capacity=4,
              drop_tokens=variant == "capacity_1.25", use_rts=False)
    with torch.no_grad():  # with x[..., 0] near 1.5: expert 0 busiest, expert 3 least
        moe.deepspeed_moe.gate.wg.weight[:, 0] += torch.tensor([skew, skew * 0.4, 0, -skew * 0.4])
    moe.deepspeed_moe.ragged_dropless = variant == "dropless_ragged"
    moe.set_deepspeed_parallelism()
    return moe


def _rows(moe, counts, tokens) -> int:
    """Rows this rank's experts ran on in the last forward (``counts``: its exp_counts)."""
    layer = moe.deepspeed_moe
    if layer.gate.drop_tokens:  # [2 source ranks x 2 local experts, C] at capacity 1.25
        return 4 * max(math.ceil(tokens / 4 * 1.25), 4)
    total = counts.clone()
    if layer.ragged_dropless:  # exactly the choices routed to its experts
        dist.all_reduce(total)
        return int(total.view(2, -1)[dist.get_rank()].sum())
    dist.all_reduce(total, op=dist.ReduceOp.MAX)  # padded to the busiest expert
    return 4 * int(total.max())


def _worker(rank, args, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from dslaunch.engine.comm import api as comm_api

    d = args.d_model
    layers = {v: _layer(v, d, args.skew) for v in VARIANTS}
    torch.manual_seed(10 + rank)
    x = torch.randn(args.tokens, d)
    x[:, 0] = 1.5 + 0.5 * torch.randn(args.tokens)
    wall = {v: [] for v in VARIANTS}
    cpu = {v: [] for v in VARIANTS}
    info = {}
    for block in range(args.blocks):
        for v, moe in layers.items():
            group = moe.deepspeed_moe.ep_group
            before = comm_api.recorded_comm(group).stats().get("all_to_all", {}).get("bytes", 0)
            for _ in range(args.iters):
                xx = x.clone().requires_grad_()
                dist.barrier()
                t, c = time.perf_counter(), time.thread_time()
                out, l_aux, counts = moe(xx)
                (out.square().mean() + 0.01 * l_aux).backward()
                wall[v].append(time.perf_counter() - t)
                cpu[v].append(time.thread_time() - c)
            if block == 0:
                after = comm_api.recorded_comm(group).stats()["all_to_all"]["bytes"]
                info[v] = {"all_to_all_bytes_per_iter": (after - before) / args.iters,
                           "expert_rows": _rows(moe, counts, args.tokens),
                           "exp_counts": counts.tolist(),
                           "dropped": moe.deepspeed_moe.tokens_dropped.item()}

    def pct(xs, q):
        xs = sorted(xs)
        return round(xs[int(q * (len(xs) - 1))] * 1000, 3)

    res = {v: {"wall_ms_p20": pct(wall[v], 0.2), "wall_ms_median": pct(wall[v], 0.5),
               "cpu_ms_median": pct(cpu[v], 0.5), **info[v]} for v in VARIANTS}
    Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(res))
    bu.end_spawned_worker()


def main(argv=None):
    args = parse_args(argv)
    result = {"benchmark": "moe_dispatch", "started": bu.now_iso(), "machine": bu.machine(),
              "loadavg_before": bu.loadavg(), "git": bu.git_rev(),
              "versions": {"torch": bu.pkg_version("torch")},
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "note": "CPU, gloo, OMP_NUM_THREADS=1, 2 ranks, EP 2, 4 experts, top-1; the "
                      "machine may be shared (loadavg): wall_ms_p20 is the least disturbed"}
    with tempfile.TemporaryDirectory(prefix="bench_moe_dispatch_") as tmp:
        mp.spawn(_worker, args=(args, bu.free_port(), tmp), nprocs=2, join=True)
        ranks = [json.loads(Path(tmp, f"rank_{r}.json").read_text()) for r in range(2)]
    result["ranks"] = ranks
    # a step waits for the slower rank: compare the larger of the two ranks' figures
    summary = {}
    for v in VARIANTS:
        summary[v] = {k: max(r[v][k] for r in ranks)
                      for k in ("wall_ms_p20", "wall_ms_median", "cpu_ms_median",
                                "all_to_all_bytes_per_iter", "expert_rows")}
    for v in VARIANTS[1:]:
        for k in ("wall_ms_p20", "wall_ms_median", "cpu_ms_median"):
            summary[v][f"ratio_capacity_over_this_{k}"] = bu.ratio(summary[VARIANTS[0]][k],
                                                                   summary[v][k])
    result["summary"] = summary
    result["loadavg_after"] = bu.loadavg()
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    else:
        out = bu.save_json(result, "moe_dispatch", bu.RESULTS)
    for v in VARIANTS:
        s = summary[v]
        bu.log(f"{v:>16}: wall p20 {s['wall_ms_p20']} ms, median {s['wall_ms_median']} ms, "
               f"cpu {s['cpu_ms_median']} ms, a2a {s['all_to_all_bytes_per_iter']:.0f} B, "
               f"rows {s['expert_rows']}"
               + (f", capacity/this (p20) {s['ratio_capacity_over_this_wall_ms_p20']}"
                  if v != VARIANTS[0] else ""))
    bu.log(f"wrote {out}")


if __name__ == "__main__":
    main()
