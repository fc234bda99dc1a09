"""The offline data analyzer (DeepSpeed's ``DataAnalyzer``): per-sample difficulty metrics of a
dataset, computed once before training, written in DeepSpeed's file layout so its sampler and
ours read each other's output.

Map: worker ``worker_id`` of ``num_workers`` takes its contiguous share of the dataset and splits
it again over ``num_threads`` processes; each runs the ``metric_functions`` over batches and
writes, under ``save_path/<metric>/worker<w>_thread<t>/``:

- ``single_value_per_sample``: ``<metric>_sample_to_metric`` (one item per sample, in dataset
  order) and ``<metric>_metric_to_sample_<value>.csv`` (the samples having that value);
- ``accumulate_value_over_samples``: ``<metric>_metric_value`` (the sum of the function's
  outputs over the thread's batches).

Reduce (worker 0, once every map finished): per metric, under ``save_path/<metric>/``:

- ``<metric>_sample_to_metric``: every sample's value, in the narrowest integer dtype;
- ``<metric>_index_to_sample`` / ``<metric>_index_to_metric``: item i lists the samples of the
  i-th smallest value / holds that value (what the sampler's ``value`` difficulty reads);
- ``<metric>_index_to_sample_percentile_merged``: the same rows merged into about 100 (for
  ``percentile`` difficulty when there are many distinct values);
- ``<metric>_metric_value`` for an accumulated metric.

``num_threads_reduce`` only changes how the reduce's files are cut into documents (DeepSpeed
writes one chunk per reduce process); the reduce here runs in this process.
"""

from __future__ import annotations

import csv
import glob
import multiprocessing
import os
from collections import defaultdict

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, Subset

from dslaunch.engine.features.data_efficiency.indexed_dataset import (
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    numpy_dtype,
)
from dslaunch.engine.features.data_efficiency.utils import (
    close_mmap_dataset_builder,
    create_mmap_dataset_builder,
    find_fit_int_dtype,
    split_dataset,
    split_index,
)

SINGLE_VALUE = "single_value_per_sample"
ACCUMULATE = "accumulate_value_over_samples"
METRIC_TYPES = (SINGLE_VALUE, ACCUMULATE)
CSV_FLUSH_AT = 100  # a value's sample list goes to its csv past this many (bounded memory)


def _thread_dir(save_path, metric, worker, thread) -> str:
    return f"{save_path}/{metric}/worker{worker}_thread{thread}/"


class _ThreadMetrics:
    """One map thread's running results for one metric, written to its files at ``close``."""

    def __init__(self, name, kind, dtype, directory):
        self.name, self.kind, self.dtype = name, kind, dtype
        os.makedirs(directory, exist_ok=True)
        self.prefix = f"{directory}/{name}"
        if kind == SINGLE_VALUE:
            self.builder = create_mmap_dataset_builder(f"{self.prefix}_sample_to_metric", dtype)
            for stale in glob.glob(f"{glob.escape(self.prefix)}_metric_to_sample*"):
                os.remove(stale)  # the csvs are appended to: start clean
            self.samples_of = defaultdict(list)
        else:
            self.total = None

    def add(self, values: torch.Tensor, sample_ids) -> None:
        if self.kind == ACCUMULATE:
            self.total = values.clone() if self.total is None else self.total.add_(values)
            return
        for row, sample in enumerate(sample_ids):
            self.builder.add_item(values[row].reshape(-1))
            self.samples_of[values[row].item()].append(sample)
        for value, samples in self.samples_of.items():
            if len(samples) > CSV_FLUSH_AT:
                self._flush(value)

    def _flush(self, value) -> None:
        with open(f"{self.prefix}_metric_to_sample_{value}.csv", "a") as f:
            csv.writer(f).writerows([self.samples_of[value]])
        self.samples_of[value] = []

    def close(self) -> None:
        if self.kind == ACCUMULATE:
            if self.total is not None:
                builder = create_mmap_dataset_builder(f"{self.prefix}_metric_value", self.dtype)
                builder.add_item(self.total.reshape(-1))
                close_mmap_dataset_builder(builder, f"{self.prefix}_metric_value")
            return
        close_mmap_dataset_builder(self.builder, f"{self.prefix}_sample_to_metric")
        for value in list(self.samples_of):
            if self.samples_of[value]:
                self._flush(value)


class DataAnalyzer:
    def __init__(self, dataset, num_workers=1, worker_id=0, num_threads=1, num_threads_reduce=1,
                 specific_threads=(), batch_size=1, metric_names=(), metric_functions=(),
                 metric_types=(), metric_dtypes=(), save_path="./", collate_fn=None,
                 custom_map_init=None, custom_map_update=None, custom_map_finalize=None,
                 custom_reduce=None, sample_indices=None):
        lengths = {len(metric_names), len(metric_functions), len(metric_types),
                   len(metric_dtypes)}
        if len(lengths) != 1:
            raise ValueError("DataAnalyzer: metric_names, metric_functions, metric_types and "
                             "metric_dtypes must have one entry per metric")
        for kind in metric_types:
            if kind not in METRIC_TYPES:
                raise ValueError(f"DataAnalyzer: metric type {kind!r}; use one of "
                                 f"{', '.join(METRIC_TYPES)}")
        if not 0 <= worker_id < num_workers:
            raise ValueError(f"DataAnalyzer: worker_id {worker_id} is not in [0, {num_workers})")
        for dtype in metric_dtypes:
            numpy_dtype(dtype)  # a clear error now rather than in a map process
        self.dataset, self.num_workers, self.worker_id = dataset, num_workers, worker_id
        self.num_threads, self.num_threads_reduce = num_threads, num_threads_reduce
        self.specific_threads = list(specific_threads)
        self.batch_size, self.collate_fn = batch_size, collate_fn
        self.metric_names, self.metric_functions = list(metric_names), list(metric_functions)
        self.metric_types, self.metric_dtypes = list(metric_types), list(metric_dtypes)
        self.save_path, self.sample_indices = save_path, sample_indices
        self.custom_map_init, self.custom_map_update = custom_map_init, custom_map_update
        self.custom_map_finalize, self.custom_reduce = custom_map_finalize, custom_reduce

    # -- map ---------------------------------------------------------------------------------------
    def init_metric_results(self, thread_id, metric_names, metric_types, metric_dtypes,
                            save_path, worker_id):
        return [_ThreadMetrics(name, kind, dtype, _thread_dir(save_path, name, worker_id,
                                                              thread_id))
                for name, kind, dtype in zip(metric_names, metric_types, metric_dtypes)]

    def _sample_ids(self, data, batch_start_idx, rows) -> list:
        if isinstance(data, dict) and "index" in data:  # Megatron's batches carry their index
            return [int(data["index"][row][0]) for row in range(rows)]
        ids = range(batch_start_idx, batch_start_idx + rows)
        if self.sample_indices is not None:  # the caller's order of the samples
            return [int(self.sample_indices[i]) for i in ids]
        return list(ids)

    def update_metric_results(self, data, metric_types, metric_dtypes, metric_functions,
                              metric_results, batch_start_idx=0):
        rows = None
        for function, dtype, result in zip(metric_functions, metric_dtypes, metric_results):
            values = function(data)
            if isinstance(values, np.ndarray):
                values = torch.from_numpy(values)
            if not torch.is_tensor(values):
                raise TypeError(f"metric {result.name}: the function must return a tensor or a "
                                f"numpy array, got {type(values).__name__}")
            if numpy_dtype(values.dtype) is not numpy_dtype(dtype):
                raise TypeError(f"metric {result.name}: the function returned {values.dtype}, "
                                f"the metric's dtype is {dtype}")
            rows = values.shape[0] if values.dim() else 1
            result.add(values, self._sample_ids(data, batch_start_idx, rows)
                       if result.kind == SINGLE_VALUE else ())
        return rows

    def finalize_metric_results(self, metric_types, metric_dtypes, metric_results):
        for result in metric_results:
            result.close()

    def run_map_helper(self, thread_id):
        start, end = (int(i) for i in self.thread_splits[thread_id])
        subset = Subset(self.dataset, list(range(start, end)))
        batches = BatchSampler(SequentialSampler(subset), batch_size=self.batch_size,
                               drop_last=False)
        loader = DataLoader(subset, batch_sampler=batches, num_workers=0,
                            collate_fn=self.collate_fn)
        init = self.custom_map_init or self.init_metric_results
        update = self.custom_map_update or self.update_metric_results
        finalize = self.custom_map_finalize or self.finalize_metric_results
        results = init(thread_id, self.metric_names, self.metric_types, self.metric_dtypes,
                       self.save_path, self.worker_id)
        done = 0
        for batch_sample_ids, data in zip(batches, loader):
            update(data, self.metric_types, self.metric_dtypes, self.metric_functions, results,
                   start + done)
            done += len(batch_sample_ids)
        finalize(self.metric_types, self.metric_dtypes, results)

    def run_map(self):
        self.worker_splits, self.thread_splits = split_dataset(
            self.dataset, self.num_workers, self.worker_id, self.num_threads)
        threads = self.specific_threads or list(range(self.num_threads))
        if self.num_threads == 1:
            self.run_map_helper(0)
            return
        # a process per thread, as DeepSpeed: metric functions are often Python-bound
        context = multiprocessing.get_context("fork")
        procs = [context.Process(target=self.run_map_helper, args=(t,)) for t in threads]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        failed = [t for t, proc in zip(threads, procs) if proc.exitcode != 0]
        if failed:
            raise RuntimeError(f"DataAnalyzer: map threads {failed} of worker {self.worker_id} "
                               "failed (see their errors above)")

    # -- reduce ------------------------------------------------------------------------------------
    def _map_dirs(self, metric) -> list:
        return [_thread_dir(self.save_path, metric, w, t) for w in range(self.num_workers)
                for t in range(self.num_threads)]

    def _reduce_single_value(self, metric, total_samples) -> None:
        out = f"{self.save_path}/{metric}/{metric}"
        parts = []
        for directory in self._map_dirs(metric):
            prefix = f"{directory}/{metric}_sample_to_metric"
            if not MMapIndexedDataset.exists(prefix):
                raise FileNotFoundError(f"DataAnalyzer reduce: {prefix}.bin/.idx missing; did "
                                        "every map worker and thread finish?")
            rows = MMapIndexedDataset(prefix, skip_warmup=True)
            parts.append(np.concatenate(rows[0:len(rows)]) if len(rows) else
                         np.zeros(0, dtype=np.int64))
        values = np.concatenate(parts)
        if len(values) != total_samples:
            raise RuntimeError(f"DataAnalyzer reduce: metric {metric} has {len(values)} samples "
                               f"in the map files, the dataset {total_samples}; did every map "
                               "worker finish?")
        unique = np.unique(values)
        value_dtype = find_fit_int_dtype(int(unique.min()), int(unique.max()))
        sample_dtype = find_fit_int_dtype(0, total_samples - 1)

        # sample_to_metric: the map threads' items in order, cut where each reduce chunk ends
        chunk_ends = [int(e) for _, e in split_index(0, len(parts), self.num_threads_reduce)]
        part_ends = np.cumsum([len(p) for p in parts])
        self._write_rows(f"{out}_sample_to_metric", value_dtype, [[v] for v in values],
                         [int(part_ends[e - 1]) if e else 0 for e in chunk_ends])

        # index_to_sample / index_to_metric: one row per distinct value, ascending
        samples_of = self._samples_per_value(metric, unique)
        value_ends = [int(e) for _, e in split_index(0, len(unique), self.num_threads_reduce)]
        self._write_rows(f"{out}_index_to_sample", sample_dtype, samples_of, value_ends)
        self._write_rows(f"{out}_index_to_metric", value_dtype, [[v] for v in unique], value_ends)

        step = max(1, len(unique) // 100)
        merged = [np.concatenate(samples_of[i:i + step]) for i in range(0, len(unique), step)]
        self._write_rows(f"{out}_index_to_sample_percentile_merged", sample_dtype, merged, [])

    def _samples_per_value(self, metric, unique) -> list:
        rows = []
        for value in unique:
            samples = []
            for directory in self._map_dirs(metric):
                path = f"{directory}/{metric}_metric_to_sample_{value}.csv"
                if os.path.isfile(path):
                    with open(path) as f:
                        for line in csv.reader(f):
                            samples.extend(int(x) for x in line)
            rows.append(np.asarray(samples, dtype=np.int64))
        return rows

    @staticmethod
    def _write_rows(prefix, dtype, rows, chunk_ends) -> None:
        """``rows`` as items, with a document ending at each of ``chunk_ends`` (item counts) and
        once more at the end: the boundaries DeepSpeed's merge of its reduce chunks leaves."""
        builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for row in rows:
            builder.add_item_numpy(np.asarray(row, dtype=np.int64))
        builder._doc_idx.extend(chunk_ends)
        close_mmap_dataset_builder(builder, prefix)

    def _reduce_accumulated(self, metric) -> None:
        total = None
        for directory in self._map_dirs(metric):
            value = np.copy(MMapIndexedDataset(f"{directory}/{metric}_metric_value",
                                               skip_warmup=True)[0])
            total = value if total is None else total + value
        dtype = find_fit_int_dtype(int(total.min()), int(total.max()))
        prefix = f"{self.save_path}/{metric}/{metric}_metric_value"
        builder = create_mmap_dataset_builder(prefix, dtype)
        builder.add_item_numpy(total.astype(np.int64))
        close_mmap_dataset_builder(builder, prefix)

    def merge_map_results(self, dataset, metric_names, metric_types, save_path, num_workers,
                          num_threads, num_threads_reduce):
        for name, kind in zip(metric_names, metric_types):
            if kind == SINGLE_VALUE:
                self._reduce_single_value(name, len(dataset))
            else:
                self._reduce_accumulated(name)

    def run_reduce(self):
        reduce = self.custom_reduce or self.merge_map_results
        reduce(self.dataset, self.metric_names, self.metric_types, self.save_path,
               self.num_workers, self.num_threads, self.num_threads_reduce)

    def run_map_reduce(self, comm_group=None):
        """Map this worker's share, wait for every worker, reduce on worker 0. Across processes
        the wait is a ``torch.distributed`` barrier (initialise it first when num_workers > 1)."""
        self.run_map()
        _barrier(comm_group, self.num_workers)
        if self.worker_id == 0:
            self.run_reduce()
        _barrier(comm_group, self.num_workers)


def _barrier(group, num_workers) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)
    elif num_workers > 1:
        raise RuntimeError("DataAnalyzer.run_map_reduce with num_workers > 1 needs "
                           "torch.distributed initialised (the workers wait for each other); "
                           "or call run_map() in each worker and run_reduce() in one after")
