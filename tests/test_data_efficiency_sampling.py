"""Data-efficiency curriculum data sampling: the offline analyzer's index files, the sampler's
batches against the schedule, the data-parallel split, and resumes (runtime/data_pipeline/
data_sampling/). The engine's use of it under `dslaunch run`: test_data_efficiency_engine.py."""

import io
import json
import math

import numpy as np
import pytest
import torch

from dslaunch.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
from dslaunch.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
from dslaunch.runtime.data_pipeline.data_sampling.indexed_dataset import (
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    make_dataset,
)

N = 200


def length_of(i: int) -> int:  # a scrambled "sequence length" in 1..30
    return (i * 7) % 30 + 1


class Lengths(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([length_of(i), i])


def _analyze(save_path, num_workers=1, num_threads=1):
    common = dict(num_workers=num_workers, num_threads=num_threads, batch_size=8,
                  metric_names=["seqlen", "total"],
                  metric_functions=[lambda b: b[:, 0].clone(), lambda b: b[:, 0].sum(0, True)],
                  metric_types=["single_value_per_sample", "accumulate_value_over_samples"],
                  metric_dtypes=[torch.long, torch.long], save_path=str(save_path))
    for worker in range(num_workers):
        DataAnalyzer(Lengths(), worker_id=worker, **common).run_map()
    DataAnalyzer(Lengths(), **common).run_reduce()
    return f"{save_path}/seqlen/seqlen"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return _analyze(tmp_path_factory.mktemp("analyzer"))


def _rows(prefix):
    data = MMapIndexedDataset(prefix)
    return [list(map(int, data[i])) for i in range(len(data))]


def test_analyzer_index_files_hold_the_known_metrics(index):
    values = sorted({length_of(i) for i in range(N)})
    assert _rows(f"{index}_index_to_metric") == [[v] for v in values]
    assert _rows(f"{index}_index_to_sample") == \
        [[i for i in range(N) if length_of(i) == v] for v in values]
    assert _rows(f"{index}_sample_to_metric") == [[length_of(i)] for i in range(N)]
    assert MMapIndexedDataset(f"{index}_sample_to_metric").dtype is np.uint8  # values <= 255
    merged = _rows(f"{index}_index_to_sample_percentile_merged")
    assert sum(merged, []) == sum(_rows(f"{index}_index_to_sample"), [])
    total = MMapIndexedDataset(index.replace("seqlen/seqlen", "total/total_metric_value"))
    assert list(total[0]) == [sum(length_of(i) for i in range(N))]


def test_one_or_two_workers_and_threads_write_the_same_files(index, tmp_path):
    split = _analyze(tmp_path, num_workers=2, num_threads=2)
    for suffix in ("sample_to_metric", "index_to_sample", "index_to_metric",
                   "index_to_sample_percentile_merged"):
        for ext in (".bin", ".idx"):
            with open(index + "_" + suffix + ext, "rb") as a, open(split + "_" + suffix + ext,
                                                                   "rb") as b:
                assert a.read() == b.read(), suffix + ext


def test_indexed_dataset_round_trip_and_merge(tmp_path):
    first = MMapIndexedDatasetBuilder(f"{tmp_path}/a.bin", dtype=np.int32)
    first.add_item(torch.tensor([1, 2, 3]))
    first.add_item_numpy(np.array([-4]))
    first.end_document()
    first.finalize(f"{tmp_path}/a.idx")
    both = MMapIndexedDatasetBuilder(f"{tmp_path}/b.bin", dtype=np.int32)
    both.add_item_numpy(np.array([9, 9]))
    both.end_document()
    both.merge_file_(f"{tmp_path}/a")
    both.finalize(f"{tmp_path}/b.idx")
    data = make_dataset(f"{tmp_path}/b", "mmap")
    assert [list(x) for x in data[0:3]] == [[9, 9], [1, 2, 3], [-4]]
    assert list(data.doc_idx) == [0, 1, 3] and list(data.sizes) == [2, 3, 1]
    assert list(data.get(1, offset=1, length=2)) == [2, 3]
    with pytest.raises(ValueError, match="only 'mmap'"):
        make_dataset(f"{tmp_path}/b", "cached")


def _config(index, cluster_dir, difficulty_type="value", lo=5, hi=30, steps=12, step=5,
            seed=1234):
    return {"enabled": True, "seed": seed, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "data_cluster_path": str(cluster_dir), "curriculum_metrics": {"seqlen": {
            "index_to_sample_path": f"{index}_index_to_sample",
            "index_to_metric_path": f"{index}_index_to_metric",
            "difficulty_type": difficulty_type, "clustering_type": "schedule_based",
            "min_difficulty": lo, "max_difficulty": hi, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": steps, "difficulty_step": step}}}}}}


def _sampler(config, micro=3, dp=1, rank=0, gas=2):
    return DeepSpeedDataSampler(config, N, micro_batch_size=micro, data_parallel_rank=rank,
                                data_parallel_size=dp, gradient_accumulation_steps=gas,
                                global_rank=rank)


def _global_batches(sampler, count, gas=2):
    """``count`` global batches (their micro batches' indices), each with the step and the
    difficulties then."""
    it, out = iter(sampler), []
    for _ in range(count):
        batch = sum((next(it) for _ in range(gas)), [])
        out.append((sampler.curriculum_step, dict(sampler.current_difficulties), batch))
    return out


def _scheduled(step, lo=5, hi=30, total=12, quantum=5):
    value = math.floor(min(step / total, 1.0) * (hi - lo) + lo)
    return min(value - value % quantum, hi)


def test_value_difficulty_follows_the_schedule(index, tmp_path):
    sampler = _sampler(_config(index, tmp_path))
    seen_hardest = set()
    for step, difficulties, batch in _global_batches(sampler, 20):
        limit = _scheduled(step)
        assert difficulties["seqlen"] == limit
        assert len(batch) == 6 and all(length_of(i) <= limit for i in batch), (step, batch)
        seen_hardest.add(max(length_of(i) for i in batch))
    assert max(seen_hardest) > 25  # the schedule really opened up to the hard samples
    assert {f.name for f in tmp_path.iterdir()} >= {"cluster_seqlen5.bin", "cluster_seqlen30.idx"}


def test_percentile_difficulty_serves_the_easiest_share(index, tmp_path):
    config = _config(index, tmp_path, difficulty_type="percentile", lo=10, hi=100, step=10)
    del config["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["seqlen"][
        "index_to_metric_path"]
    order = sum(_rows(f"{index}_index_to_sample"), [])  # easiest first
    for step, _, batch in _global_batches(_sampler(config), 20):
        percentile = _scheduled(step, 10, 100, 12, 10)
        allowed = set(order[:N // 100 * percentile] if percentile < 100 else order)
        assert set(batch) <= allowed, (step, percentile)


def test_two_data_parallel_ranks_split_the_same_global_batch(index, tmp_path):
    whole = _sampler(_config(index, tmp_path / "one"), micro=4, dp=1)
    ranks = [_sampler(_config(index, tmp_path / "two"), micro=2, dp=2, rank=r) for r in (0, 1)]
    its = [iter(s) for s in ranks]
    for micro in iter(whole):
        parts = [next(it) for it in its]
        assert len(parts[0]) == len(parts[1]) == 2
        assert parts[0] + parts[1] == micro  # disjoint positions of one micro batch
        if whole.curriculum_step > 30:
            break
    assert any(p.name.startswith("cluster") for p in (tmp_path / "two").iterdir())  # rank 0


def test_state_dict_resume_continues_the_exact_order(index, tmp_path):
    config = _config(index, tmp_path)
    full = _sampler(config)
    it = iter(full)
    reference = [next(it) for _ in range(120)]  # clusters run out and are reshuffled on the way

    first = _sampler(config)
    it = iter(first)
    head = [next(it) for _ in range(47)]
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as the checkpoint holds it
    buffer.seek(0)
    resumed = _sampler(config)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    it = iter(resumed)
    tail = [next(it) for _ in range(120 - 47)]
    assert head + tail == reference


def test_the_sampler_refuses_a_disabled_curriculum_and_missing_files(index, tmp_path):
    config = _config(index, tmp_path)
    config["data_sampling"]["curriculum_learning"]["enabled"] = False
    with pytest.raises(ValueError, match="curriculum_learning.enabled"):
        _sampler(config)
    config = _config(index + "_nope", tmp_path)
    with pytest.raises(FileNotFoundError, match="index_to_sample_path"):
        _sampler(config)


# -- the engine: `dslaunch run`, 2 ranks, save and resume ------------------------------------------

class ScriptSamples(torch.utils.data.Dataset):
    """The lengths of tests/scripts/data_sampling_train.py's samples (the analyzer's input)."""

    def __len__(self):
        return 240

    def __getitem__(self, i):
        return torch.tensor([(i * 7) % 12 + 1])


def test_two_ranks_train_save_and_resume_in_the_same_sample_order(tmp_path):
    from helpers import launch

    DataAnalyzer(ScriptSamples(), batch_size=32, metric_names=["seqlen"],
                 metric_functions=[lambda b: b[:, 0].clone()],
                 metric_types=["single_value_per_sample"], metric_dtypes=[torch.long],
                 save_path=str(tmp_path / "analysis")).run_map_reduce()
    index = tmp_path / "analysis" / "seqlen" / "seqlen"
    config = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3,
              "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
              "data_efficiency": {"enabled": True, "seed": 7, "data_sampling": {
                  "enabled": True, "curriculum_learning": {
                      "enabled": True, "data_cluster_path": str(tmp_path / "clusters"),
                      "curriculum_metrics": {"seqlen": {
                          "index_to_sample_path": f"{index}_index_to_sample",
                          "index_to_metric_path": f"{index}_index_to_metric",
                          "difficulty_type": "value", "clustering_type": "schedule_based",
                          "min_difficulty": 3, "max_difficulty": 12,
                          "schedule_type": "fixed_discrete",
                          "schedule_config": {"difficulty": [3, 6, 12], "max_step": [3, 6]}}}}}}}
    ckpt = tmp_path / "ckpt"
    for run in ("full", "resumed"):
        (tmp_path / run).mkdir()
    launch(tmp_path / "full", config, "data_sampling_train.py",
           ["--out", str(tmp_path / "full"), "--steps", "9", "--save-dir", str(ckpt),
            "--save-at", "4"], nproc=2)
    launch(tmp_path / "resumed", config, "data_sampling_train.py",
           ["--out", str(tmp_path / "resumed"), "--steps", "9", "--save-dir", str(ckpt),
            "--resume"], nproc=2)
    full = [json.loads((tmp_path / "full" / f"rank_{r}.json").read_text()) for r in (0, 1)]
    resumed = [json.loads((tmp_path / "resumed" / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["start"] for r in resumed] == [4, 4]
    for step in range(9):
        a, b = (full[r]["steps"][str(step)] for r in (0, 1))
        limit = 3 if step < 3 else 6 if step < 6 else 12  # curriculum step = step + 1
        assert a["difficulty"] == b["difficulty"] == limit, step
        assert all(length_of_script(i) <= limit for m in a["micro"] + b["micro"] for i in m)
        for mine, theirs in zip(a["micro"], b["micro"]):  # one global micro batch, split
            assert len(mine) == len(theirs) == 3 and not set(mine) & set(theirs)
        if step >= 4:  # the resumed run continues with the same samples, and the same losses
            for r in (0, 1):
                again = resumed[r]["steps"][str(step)]
                assert again["micro"] == full[r]["steps"][str(step)]["micro"], (step, r)
                assert again["loss"] == pytest.approx(full[r]["steps"][str(step)]["loss"],
                                                      rel=1e-6)


def length_of_script(i: int) -> int:
    return (i * 7) % 12 + 1
