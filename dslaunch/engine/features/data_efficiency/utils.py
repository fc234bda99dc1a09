"""Helpers of the data analyzer and sampler (DeepSpeed's ``data_sampling.utils`` names)."""

from __future__ import annotations

import numpy as np

from dslaunch.engine.features.data_efficiency.indexed_dataset import MMapIndexedDatasetBuilder


def find_fit_int_dtype(min_value, max_value):
    """The narrowest integer dtype holding [min_value, max_value] (unsigned when min >= 0)."""
    candidates = (np.uint8, np.uint16, np.uint32, np.uint64) if min_value >= 0 else \
        (np.int8, np.int16, np.int32, np.int64)
    for dtype in candidates:
        info = np.iinfo(dtype)
        if info.min <= min_value and max_value <= info.max:
            return dtype
    return candidates[-1]


def split_index(start_idx: int, end_idx: int, num_partitions: int) -> list:
    """``num_partitions`` contiguous ``(start, end)`` ranges covering [start_idx, end_idx)."""
    bounds = np.linspace(start_idx, end_idx, dtype=int, num=num_partitions + 1)
    return [(bounds[i], bounds[i + 1]) for i in range(num_partitions)]


def split_dataset(dataset, num_workers: int, worker_id: int, num_threads: int):
    """The workers' ranges of ``dataset`` and the threads' ranges of worker ``worker_id``."""
    worker_splits = split_index(0, len(dataset), num_workers)
    start, end = worker_splits[worker_id]
    return worker_splits, split_index(start, end, num_threads)


def create_mmap_dataset_builder(fname: str, dtype) -> MMapIndexedDatasetBuilder:
    return MMapIndexedDatasetBuilder(f"{fname}.bin", dtype=dtype)


def close_mmap_dataset_builder(builder: MMapIndexedDatasetBuilder, fname: str) -> None:
    """One document of everything added, then the index (the analyzer's files' shape)."""
    builder.end_document()
    builder.finalize(f"{fname}.idx")
