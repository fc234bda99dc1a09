"""``DeepSpeedDataSampler``: curriculum data sampling. Each global batch is drawn from the samples
whose difficulty the curriculum allows at this step, and split over the data-parallel ranks.

Per metric of ``data_sampling.curriculum_learning.curriculum_metrics`` a ``CurriculumScheduler``
moves the difficulty with the step. When a difficulty changes, the samples it newly admits (read
from the data analyzer's ``index_to_sample``/``index_to_metric`` files) become a new *cluster*,
shuffled. A global batch takes from each cluster in proportion to its size, each cluster read in
order (reshuffled when exhausted), and is shuffled again.

- ``difficulty_type: value``: a cluster holds the samples with prev < metric <= difficulty;
  ``percentile``: the samples between the prev-th and the difficulty-th percentile of the metric
  (the analyzer's rows in order; ``max_difficulty`` is the 100%).
- ``clustering_type: single_cluster``: the metric takes no part in the choice (every sample).
  With two or more ``schedule_based`` metrics a new cluster is the samples every metric admits,
  minus those already in a cluster.

The draws follow DeepSpeed 0.19.8's sampler exactly (one ``numpy.random.default_rng(seed)``
consumed in the same order), so with the same config, seed and index files both serve the same
sample indices. Two differences, both for exact resumes: every data-parallel rank computes the
batch itself (the same draws; DeepSpeed computes it on rank 0 and broadcasts it), rank 0 alone
writing the cluster files under ``data_cluster_path``; and ``state_dict`` also holds the
sampler's generator state and the clusters' current order (DeepSpeed's saves the global numpy
state and re-reads the cluster files, so a resumed DeepSpeed run draws from a fresh generator).
"""

from __future__ import annotations

import os

import numpy as np

from dslaunch.config.data_efficiency import curriculum_problems, data_efficiency_config
from dslaunch.engine.features.curriculum import CurriculumScheduler
from dslaunch.engine.features.data_efficiency.indexed_dataset import MMapIndexedDataset
from dslaunch.engine.features.data_efficiency.utils import (
    close_mmap_dataset_builder,
    create_mmap_dataset_builder,
    find_fit_int_dtype,
)

KEY = "data_efficiency.data_sampling.curriculum_learning"
# DeepSpeed's state_dict keys (ours adds the last two)
STATE_KEYS = ("batch", "consumed_samples", "curriculum_step", "current_difficulties",
              "data_cluster_paths", "data_cluster_current_position", "np_rng_state")
RNG_KEY, CLUSTERS_KEY = "sampler_rng_state", "data_clusters"


def _full_config(config: dict) -> dict:
    """DeepSpeed's filled-in config from either it or the raw ``data_efficiency`` section."""
    sampling = config.get("data_sampling") or {}
    filled = "num_epochs" in sampling and "seed" in config
    return config if filled else data_efficiency_config(config)


class DeepSpeedDataSampler:
    def __init__(self, data_efficiency_config, one_epoch_total_samples, micro_batch_size,
                 data_parallel_rank, data_parallel_size, data_parallel_group=None,
                 gradient_accumulation_steps=1, global_rank=0, drop_last=True):
        self.data_efficiency_config = _full_config(data_efficiency_config)
        sampling = self.data_efficiency_config["data_sampling"]
        curriculum = sampling["curriculum_learning"]
        if curriculum.get("enabled") is not True:
            raise ValueError(f"DeepSpeedDataSampler: {KEY}.enabled is not true; the sampler "
                             "serves only curriculum batches (DeepSpeed's would serve none)")
        problems = curriculum_problems(curriculum, KEY)
        if problems:
            raise ValueError("; ".join(problems))
        if one_epoch_total_samples <= 0 or micro_batch_size <= 0 or data_parallel_size <= 0:
            raise ValueError("DeepSpeedDataSampler: the dataset, micro batch and data-parallel "
                             "size must all be > 0")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"DeepSpeedDataSampler: data_parallel_rank {data_parallel_rank} is "
                             f"not in [0, {data_parallel_size})")
        self.one_epoch_total_samples = one_epoch_total_samples
        self.total_samples = one_epoch_total_samples * sampling["num_epochs"]
        self.index_dtype = find_fit_int_dtype(0, one_epoch_total_samples)
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank, self.data_parallel_size = data_parallel_rank, data_parallel_size
        self.data_parallel_group = data_parallel_group
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.global_batch_size = self.micro_batch_times_data_parallel_size * \
            gradient_accumulation_steps
        self.global_rank, self.drop_last = global_rank, drop_last
        self.np_rng = np.random.default_rng(self.data_efficiency_config["seed"])
        self.batch: list = []
        self.consumed_samples = 0

        self.cluster_root = curriculum["data_cluster_path"]
        self.curriculum_step = 0
        self.current_difficulties: dict = {}
        self.data_cluster_paths: list = []  # file names under cluster_root
        self.data_cluster_current_position: list = []
        self.data_clusters: list = []  # arrays of sample indices, in their current order
        self.metrics = curriculum["curriculum_metrics"]
        self.curriculum_schedulers = {m: CurriculumScheduler(c) for m, c in self.metrics.items()}
        self.difficulty_type = {m: c["difficulty_type"] for m, c in self.metrics.items()}
        self.clustering_type = {m: c["clustering_type"] for m, c in self.metrics.items()}
        self.curriculum_index_to_sample, self.curriculum_index_to_metric = {}, {}
        for metric, cfg in self.metrics.items():
            if cfg["clustering_type"] == "single_cluster":
                continue
            self.curriculum_index_to_sample[metric] = _open(cfg["index_to_sample_path"], metric,
                                                            "index_to_sample_path")
            if cfg["difficulty_type"] == "value":
                self.curriculum_index_to_metric[metric] = _open(
                    cfg["index_to_metric_path"], metric, "index_to_metric_path")
        self.data_1epoch_size = None
        if self.global_rank == 0:
            os.makedirs(self.cluster_root, exist_ok=True)

    def __len__(self) -> int:
        return self.total_samples

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict: dict) -> None:
        for metric, scheduler in self.curriculum_schedulers.items():
            if metric in schedule_func_dict:
                scheduler.set_custom_get_difficulty(schedule_func_dict[metric])

    def get_start_end_idx(self, batch_len=None):
        """This rank's ``[start, end)`` of a micro batch over all data-parallel ranks."""
        batch_len = batch_len or self.micro_batch_times_data_parallel_size
        def edge(rank):
            return round(rank * batch_len / self.data_parallel_size)
        return edge(self.data_parallel_rank), edge(self.data_parallel_rank + 1)

    # -- which samples a difficulty admits ----------------------------------------------------------
    def get_sample_based_on_metric_value(self, metric, value_start, value_end):
        """The samples with ``value_start < metric <= value_end`` (None when there are none)."""
        samples, to_sample = [], self.curriculum_index_to_sample[metric]
        for row, value in enumerate(self.curriculum_index_to_metric[metric]):
            if value_start < value[0] <= value_end:
                samples.append(np.copy(to_sample[row]))
        return np.concatenate(samples) if samples else None

    def get_sample_based_on_metric_percentile(self, metric, percentile_start, percentile_end):
        """The samples from the ``percentile_start``-th to the ``percentile_end``-th percentile
        of the metric, in the analyzer's (ascending) order."""
        to_sample = self.curriculum_index_to_sample[metric]
        if self.data_1epoch_size is None:  # (DeepSpeed's: measured once, on the first metric)
            self.data_1epoch_size = int(sum(len(row) for row in to_sample))
        max_percentile = self.metrics[metric]["max_difficulty"]
        per_percentile = self.data_1epoch_size // max_percentile
        start = per_percentile * percentile_start
        end = self.data_1epoch_size if percentile_end == max_percentile else \
            per_percentile * percentile_end
        samples, seen = [], 0
        for row in range(len(to_sample)):
            size = len(to_sample[row])
            if seen + size > start:
                lo, hi = max(0, start - seen), min(size, end - seen)
                samples.append(np.copy(to_sample[row][lo:hi]))
            seen += size
            if seen >= end:
                break
        return np.concatenate(samples) if samples else None

    def _admitted(self, metric, low, high):
        if self.difficulty_type[metric] == "value":
            return self.get_sample_based_on_metric_value(metric, low, high)
        return self.get_sample_based_on_metric_percentile(metric, low, high)

    # -- clusters -----------------------------------------------------------------------------------
    def _cluster_name(self) -> str:
        return "cluster" + "".join(f"_{m}{self.current_difficulties[m]}"
                                   for m in self.curriculum_schedulers)

    def get_new_cluster(self, previous_difficulties: dict) -> None:
        scheduled = [m for m in self.curriculum_schedulers
                     if self.clustering_type[m] != "single_cluster"]
        new = None
        if len(scheduled) > 1:  # what every metric admits now, less what earlier clusters hold
            for metric in self.curriculum_schedulers:
                if metric in scheduled:
                    lowest = float("-inf") if self.difficulty_type[metric] == "value" else 0
                    admitted = self._admitted(metric, lowest, self.current_difficulties[metric])
                else:
                    admitted = np.arange(self.one_epoch_total_samples, dtype=self.index_dtype)
                new = admitted if new is None else \
                    np.intersect1d(new, admitted, assume_unique=True)
            for cluster in self.data_clusters:
                new = np.setdiff1d(new, cluster, assume_unique=True)
        else:  # what the one scheduled metric newly admits (or, with none, every sample once)
            if not self.data_clusters:
                new = np.arange(self.one_epoch_total_samples, dtype=self.index_dtype)
            for metric in scheduled:
                new = self._admitted(metric, previous_difficulties[metric],
                                     self.current_difficulties[metric])
        if new is None or len(new) == 0:
            return
        new = np.asarray(new)
        self.np_rng.shuffle(new)
        name = self._cluster_name()
        self._write_cluster(name, new)
        self.data_clusters.append(new)
        self.data_cluster_paths.append(name)
        self.data_cluster_current_position.append(0)

    def _write_cluster(self, name: str, cluster) -> None:
        """Rank 0 keeps the cluster on disk (DeepSpeed's layout; its sampler resumes from it)."""
        if self.global_rank != 0:
            return
        path = os.path.join(self.cluster_root, name)
        builder = create_mmap_dataset_builder(path, self.index_dtype)
        builder.add_item_numpy(cluster)
        close_mmap_dataset_builder(builder, path)

    def sample_from_clusters(self):
        """How many of the global batch each cluster gives (drawn by cluster size)."""
        total = sum(len(c) for c in self.data_clusters)
        if not total:
            raise RuntimeError(f"{KEY}: no sample has a difficulty the schedule allows at step "
                               f"{self.curriculum_step} ({self.current_difficulties}); lower "
                               "min_difficulty or check the index files")
        weights = [len(c) / total for c in self.data_clusters]
        picks = self.np_rng.choice(len(self.data_clusters), self.global_batch_size, replace=True,
                                   p=weights)
        return np.bincount(picks, minlength=len(self.data_clusters))

    def reshuffle_clusters(self, cidx: int) -> None:
        cluster = np.copy(self.data_clusters[cidx])
        self.np_rng.shuffle(cluster)
        self.data_clusters[cidx] = cluster
        self._write_cluster(self.data_cluster_paths[cidx], cluster)

    def get_sample_from_cluster(self, cidx: int, num_samples: int) -> list:
        start = self.data_cluster_current_position[cidx]
        samples = list(self.data_clusters[cidx][start:start + num_samples])
        self.data_cluster_current_position[cidx] += num_samples
        if len(samples) < num_samples:  # the cluster ran out: a new pass in a new order
            missing = num_samples - len(samples)
            self.reshuffle_clusters(cidx)
            samples += list(self.data_clusters[cidx][:missing])
            self.data_cluster_current_position[cidx] = missing
        return samples

    # -- batches ------------------------------------------------------------------------------------
    def get_next_global_batch(self) -> None:
        self.curriculum_step += 1
        previous, changed = {}, False
        for metric, scheduler in self.curriculum_schedulers.items():
            difficulty = scheduler.update_difficulty(self.curriculum_step)
            if metric in self.current_difficulties:
                previous[metric] = self.current_difficulties[metric]
                changed |= difficulty != previous[metric]
            else:
                previous[metric] = float("-inf") if self.difficulty_type[metric] == "value" else 0
                changed = True
            self.current_difficulties[metric] = difficulty
        if changed:
            self.get_new_cluster(previous)
        batch = []
        for cidx, count in enumerate(self.sample_from_clusters()):
            batch += self.get_sample_from_cluster(cidx, int(count))
        self.np_rng.shuffle(batch)
        self.batch = [int(i) for i in batch]

    def __iter__(self):
        step = self.micro_batch_times_data_parallel_size
        while self.consumed_samples <= self.total_samples:
            if not self.batch:
                self.get_next_global_batch()
            current, self.batch = self.batch[:step], self.batch[step:]
            if len(current) == step or (current and not self.drop_last):
                start, end = self.get_start_end_idx(len(current))
                yield current[start:end]
                self.consumed_samples += len(current)

    # -- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"batch": list(self.batch), "consumed_samples": self.consumed_samples,
                "curriculum_step": self.curriculum_step,
                "current_difficulties": dict(self.current_difficulties),
                "data_cluster_paths": list(self.data_cluster_paths),
                "data_cluster_current_position": list(self.data_cluster_current_position),
                "np_rng_state": np.random.get_state(),  # DeepSpeed's key and value
                RNG_KEY: self.np_rng.bit_generator.state,
                CLUSTERS_KEY: list(self.data_clusters)}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise KeyError(f"DeepSpeedDataSampler.load_state_dict: not a sampler state (no "
                           f"{', '.join(missing)})")
        self.batch = list(state["batch"])
        self.consumed_samples = state["consumed_samples"]
        self.curriculum_step = state["curriculum_step"]
        self.current_difficulties = dict(state["current_difficulties"])
        # DeepSpeed once stored absolute paths: the name alone, found under data_cluster_path
        self.data_cluster_paths = [os.path.basename(p) for p in state["data_cluster_paths"]]
        self.data_cluster_current_position = list(state["data_cluster_current_position"])
        np.random.set_state(state["np_rng_state"])
        if RNG_KEY in state:
            self.np_rng.bit_generator.state = state[RNG_KEY]
        if CLUSTERS_KEY in state:
            self.data_clusters = [np.asarray(c) for c in state[CLUSTERS_KEY]]
        else:  # a DeepSpeed checkpoint: the clusters as its rank 0 last wrote them
            self.data_clusters = [np.copy(_open(os.path.join(self.cluster_root, name), name,
                                                "data_cluster_path")[0])
                                  for name in self.data_cluster_paths]


def _open(path: str, what: str, key: str) -> MMapIndexedDataset:
    if not MMapIndexedDataset.exists(path):
        raise FileNotFoundError(f"{KEY} ({what}): {path}.bin/.idx not found; {key} names the "
                                "data analyzer's output without .bin/.idx")
    return MMapIndexedDataset(path, skip_warmup=True)
