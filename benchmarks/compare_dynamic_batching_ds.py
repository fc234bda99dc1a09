"""dslaunch's dynamic batching against DeepSpeed 0.19.8's ``variable_batch_size_and_lr`` (the peer
venv, outside CI).

The same synthetic sequence lengths go through both sides' functions for a grid of settings
(every ``sequence_picking_order``, min/max batch sizes, effective batch sizes, equal-size
micro-batches, filter ids, seeds 3 and 11; seed None is unseeded on both sides):

1. ``batch_by_seqlens``: micro-batch ids, batch sizes and longest lengths;
2. ``get_dataloader_and_lr_scheduler_for_variable_batch_size`` over an SGD optimizer and over a
   ``StepLR`` scheduler, for 2 data-parallel ranks: every rank's dataloader items (sample ids) and
   the scheduler's LRs over 3 passes of the batch sizes, for each ``lr_scaling_method``;
3. ``scale_lr`` on a grid; the scheduler's ``state_dict`` keys.

    python benchmarks/compare_dynamic_batching_ds.py [--peer-python PATH]

Prints a JSON summary and writes it to benchmarks/results/dynamic_batching_vs_deepspeed-<time>.json.
The peer side is this file run by the peer's python with ``--side deepspeed``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
N = 400


def lengths(kind: int) -> list:
    if kind == 0:  # scrambled 4..130
        return [(i * 37) % 127 + 4 for i in range(N)]
    if kind == 1:  # many ties
        return [(i * 13) % 5 * 16 + 8 for i in range(N)]
    return [(i * 7919) % 512 + 1 for i in range(N)]  # some over the budget


def cases() -> list:
    out = []
    for kind, order, eff, same, lo, hi, seed, filt in itertools.product(
            (0, 1, 2), ("dataloader", "random", "seqlen"), (1, 4), (False, True), (1, 2),
            (None, 3), (3, 11), (False, True)):
        if same and eff == 1:
            continue
        out.append({"kind": kind, "order": order, "eff": eff, "same": same, "lo": lo, "hi": hi,
                    "seed": seed, "filter": filt, "max_tokens": 256})
    return out


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def run_side(mod) -> dict:
    import torch

    warnings.simplefilter("ignore")
    results = {"batch_by_seqlens": [], "loaders": [], "scale_lr": [], "state_keys": None}
    for case in cases():
        lens = lengths(case["kind"])
        filt = list(range(0, N, 3)) if case["filter"] else None
        try:
            got = mod.batch_by_seqlens(lens, case["max_tokens"], filt, case["lo"], case["hi"],
                                       case["order"], case["eff"], case["same"], False,
                                       case["seed"])
            results["batch_by_seqlens"].append(_plain(list(got)))
        except AssertionError:
            results["batch_by_seqlens"].append("AssertionError")
    for case, method, base in itertools.product(cases()[::9], ("linear", "sqrt", "none"),
                                                ("sgd", "steplr")):
        lens = lengths(case["kind"])
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        sched_in = opt if base == "sgd" else torch.optim.lr_scheduler.StepLR(opt, 3, 0.7)
        row = {"items": []}
        try:
            for rank in range(2):
                loader, sched, _ = mod.get_dataloader_and_lr_scheduler_for_variable_batch_size(
                    dataset=list(range(N)), dataset_seqlens=lens,
                    max_tokens=case["max_tokens"], effective_batch_size=case["eff"],
                    lr_scaling_method=method, min_batch_size=case["lo"],
                    max_batch_size=case["hi"], sequence_picking_order=case["order"],
                    dataloader_batch_size=2, dataloader_rank=rank, dataloader_num_replicas=2,
                    dataloader_num_workers=0, lr_scheduler_or_optimizer=sched_in,
                    required_microbatches_of_same_size=case["same"], seed=case["seed"])
                row["items"].append([_plain(item) for item in loader])
                if rank == 0:
                    lrs = []
                    for _ in range(3 * len(sched.batch_sizes)):
                        lrs.append(sched.get_lr())
                        opt.step()
                        sched.step()
                    row["lrs"] = lrs
                    row["last_lr"] = _plain(sched.get_last_lr())
                    results["state_keys"] = sorted(sched.state_dict())
        except AssertionError:
            row = "AssertionError"
        results["loaders"].append(row)
    for base_bs, bs, lr, method in itertools.product((1, 4, 7), (1, 3, 8), (0.1, 1e-3),
                                                     ("linear", "sqrt", "none", None)):
        results["scale_lr"].append(mod.scale_lr(base_bs, bs, lr, method))
    return results


def side(name: str) -> dict:
    if name == "deepspeed":
        from deepspeed.runtime.data_pipeline.data_sampling import (
            variable_batch_size_and_lr as mod,
        )
    else:
        sys.path.insert(0, str(HERE.parent))
        from dslaunch.runtime.data_pipeline.data_sampling import (
            variable_batch_size_and_lr as mod,
        )
    return run_side(mod)


def _diff(a, b, path="") -> list:
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    if isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b):
        return [d for k in a for d in _diff(a[k], b[k], f"{path}.{k}")]
    return [] if a == b else [path]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["deepspeed", "dslaunch"])
    parser.add_argument("--out", help="with --side: where the side's JSON goes")
    parser.add_argument("--peer-python", default=str(HERE / ".peer-venv" / "bin" / "python"))
    args = parser.parse_args()
    if args.side:  # both sides' loggers write to stdout: the results go to a file
        Path(args.out).write_text(json.dumps(side(args.side)))
        return 0
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        peer_out = Path(tmp) / "deepspeed.json"
        subprocess.run([args.peer_python, __file__, "--side", "deepspeed", "--out",
                        str(peer_out)], capture_output=True, text=True, check=True)
        theirs = json.loads(peer_out.read_text())
    ours = json.loads(json.dumps(side("dslaunch")))
    diffs = {key: _diff(ours[key], theirs[key], key) for key in ours}
    summary = {
        "cases_batch_by_seqlens": len(ours["batch_by_seqlens"]),
        "cases_refused_alike": sum(r == "AssertionError" for r in ours["batch_by_seqlens"]),
        "microbatches_compared": sum(len(r[0]) for r in ours["batch_by_seqlens"]
                                     if r != "AssertionError"),
        "loader_cases": len(ours["loaders"]),
        "lrs_compared": sum(len(r["lrs"]) for r in ours["loaders"] if r != "AssertionError"),
        "scale_lr_compared": len(ours["scale_lr"]),
        "state_dict_keys": ours["state_keys"],
        "differences": {k: v[:10] for k, v in diffs.items()},
        "identical": not any(diffs.values()),
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(summary, indent=1))
    out = HERE / "results" / f"dynamic_batching_vs_deepspeed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
