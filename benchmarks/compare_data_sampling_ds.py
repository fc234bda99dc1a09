"""dslaunch's data-efficiency data sampling against DeepSpeed's (the peer venv, outside CI).

1. The data analyzer: the same synthetic dataset and metric functions through dslaunch's
   ``DataAnalyzer`` and DeepSpeed's (2 map workers, then the reduce); every output file of the
   reduce is compared byte for byte.
2. The data sampler: ``DeepSpeedDataSampler`` of each, with the same config, seed and index files
   (DeepSpeed's), serves N global batches; the sample indices are compared. DeepSpeed's needs
   ``torch.distributed``: gloo, world 1, on CPU.

    python benchmarks/compare_data_sampling_ds.py [--peer-python PATH] [--steps 60]

Prints a JSON summary and writes it to benchmarks/results/data_sampling_vs_deepspeed-<time>.json.
The peer side is this file run by the peer's python with ``--side deepspeed``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_SAMPLES = 600


class Synthetic:
    """Sample i: [length, rarity, i]; length in 4..67 and rarity in 0..999, both scrambled."""

    def __len__(self):
        return N_SAMPLES

    def __getitem__(self, i):
        import torch

        return torch.tensor([(i * 37) % 64 + 4, (i * 7919) % 1000, i], dtype=torch.long)


def _length(batch):
    return batch[:, 0].clone()


def _rarity(batch):
    return batch[:, 1].clone()


def _token_histogram(batch):  # an accumulated metric: how often each length bucket appears
    import torch

    return torch.bincount(batch[:, 0] // 8, minlength=9).to(torch.long)


def metric(path, difficulty, clustering, lo, hi, schedule, config):
    return {"index_to_sample_path": f"{path}_index_to_sample",
            "index_to_metric_path": f"{path}_index_to_metric",
            "difficulty_type": difficulty, "clustering_type": clustering,
            "min_difficulty": lo, "max_difficulty": hi, "schedule_type": schedule,
            "schedule_config": config}


def cases(index_dir: str) -> dict:
    length = f"{index_dir}/length/length"
    rarity = f"{index_dir}/rarity/rarity"
    linear = {"total_curriculum_step": 30, "difficulty_step": 8}
    root = {"total_curriculum_step": 40, "difficulty_step": 5, "root_degree": 2}
    discrete = {"difficulty": [300, 600, 999], "max_step": [10, 25]}
    return {
        "value_linear": {"length": metric(length, "value", "schedule_based", 16, 67,
                                          "fixed_linear", linear)},
        "percentile_root": {"rarity": metric(rarity, "percentile", "schedule_based", 10, 100,
                                             "fixed_root", root)},
        "two_metrics": {"length": metric(length, "value", "schedule_based", 24, 67,
                                         "fixed_linear", linear),
                        "rarity": metric(rarity, "value", "schedule_based", 300, 999,
                                         "fixed_discrete", discrete)},
        "single_cluster": {"length": metric(length, "value", "single_cluster", 16, 67,
                                            "fixed_linear", linear)},
    }


def run_side(side: str, work: str, steps: int) -> dict:
    import numpy as np
    import torch

    if side == "deepspeed":
        import deepspeed.comm as dist
        from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
        from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29555"),
                          RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_distributed(dist_backend="gloo", verbose=False)
        group = torch.distributed.new_group(ranks=[0])
    else:
        sys.path.insert(0, str(HERE.parent))
        from dslaunch.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
        from dslaunch.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
        group = None

    out = f"{work}/{side}"
    names = ["length", "rarity", "histogram"]
    common = dict(num_workers=2, num_threads=1, batch_size=16, metric_names=names,
                  metric_functions=[_length, _rarity, _token_histogram],
                  metric_types=["single_value_per_sample"] * 2 + ["accumulate_value_over_samples"],
                  metric_dtypes=[torch.long] * 3, save_path=out)
    for worker in range(2):
        DataAnalyzer(Synthetic(), worker_id=worker, **common).run_map()
    DataAnalyzer(Synthetic(), worker_id=0, **common).run_reduce()

    # both samplers read DeepSpeed's index files (its analyzer is the reference)
    served = {}
    for case, metrics in cases(f"{work}/deepspeed").items():
        config = {"enabled": True, "seed": 1234, "data_sampling": {
            "enabled": True, "num_epochs": 1000, "num_workers": 0, "pin_memory": False,
            "curriculum_learning": {"enabled": True,
                                    "data_cluster_path": f"{work}/clusters_{side}_{case}",
                                    "curriculum_metrics": metrics},
            "dynamic_batching": {"enabled": False}}, "data_routing": {}}
        sampler = DeepSpeedDataSampler(config, N_SAMPLES, micro_batch_size=4,
                                       data_parallel_rank=0, data_parallel_size=1,
                                       data_parallel_group=group, gradient_accumulation_steps=2,
                                       global_rank=0)
        batches = []
        for micro in sampler:
            batches.append([int(i) for i in micro])
            if len(batches) == 2 * steps:
                break
        served[case] = batches
    np.random.seed(0)
    return served


def files_of(root: Path) -> dict:
    """Every file the analyzer left: the map's (worker<w>_thread<t>/) and the reduce's."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def is_reduce_chunk(name: str) -> bool:
    """DeepSpeed's reduce processes' partial files (``*_thread<k>.bin/.idx`` next to the
    results), merged into the results and left behind; dslaunch's in-process reduce has none."""
    stem = name.rsplit(".", 1)[0]
    return "/worker" not in name and re.search(r"_thread\d+$", stem) is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", help="the DeepSpeed venv's python (default: peers.py)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--side", choices=("dslaunch", "deepspeed"))
    parser.add_argument("--work")
    args = parser.parse_args(argv)
    if args.side:  # one side's run, results as JSON on stdout
        print(json.dumps(run_side(args.side, args.work, args.steps)))
        return 0

    peer = args.peer_python
    if peer is None:
        sys.path.insert(0, str(HERE))
        from peers import peer_python

        peer = peer_python(create=False)
        if peer is None:
            print("no DeepSpeed peer venv: run benchmarks/peers.py or pass --peer-python")
            return 2
    with tempfile.TemporaryDirectory() as work:
        sides = {}
        for side, python in (("deepspeed", peer), ("dslaunch", sys.executable)):
            proc = subprocess.run([python, __file__, "--side", side, "--work", work,
                                   "--steps", str(args.steps)], capture_output=True, text=True)
            if proc.returncode:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                return 1
            sides[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        ds_files, our_files = files_of(Path(work, "deepspeed")), files_of(Path(work, "dslaunch"))
        file_report = {name: ("identical" if our_files.get(name) == data else
                              "missing" if name not in our_files else "DIFFERENT")
                       for name, data in ds_files.items() if not is_reduce_chunk(name)}
        chunks = sorted(name for name in ds_files if is_reduce_chunk(name))
        extra = sorted(set(our_files) - set(ds_files))
        sampler_report = {}
        for case, ds_batches in sides["deepspeed"].items():
            ours = sides["dslaunch"][case]
            first = next((i for i, (a, b) in enumerate(zip(ds_batches, ours)) if a != b), None)
            sampler_report[case] = {"micro_batches": len(ds_batches),
                                    "identical": ds_batches == ours,
                                    "first_difference_at_micro_batch": first}
    summary = {"what": "dslaunch vs DeepSpeed data sampling", "samples": N_SAMPLES,
               "global_batches": args.steps, "micro_batch": 4, "gradient_accumulation": 2,
               "analyzer_files": file_report, "files_only_dslaunch_writes": extra,
               "deepspeed_reduce_chunks_not_written_by_dslaunch": chunks,
               "sampler": sampler_report, "peer_python": os.path.basename(peer)}
    print(json.dumps(summary, indent=1))
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (results / f"data_sampling_vs_deepspeed-{stamp}.json").write_text(json.dumps(summary,
                                                                                 indent=1))
    ok = all(v == "identical" for v in file_report.values()) and \
        all(r["identical"] for r in sampler_report.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
