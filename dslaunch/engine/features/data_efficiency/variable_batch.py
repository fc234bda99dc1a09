"""DeepSpeed 0.19.8's dynamic batching (``data_sampling.variable_batch_size_and_lr``): micro-batches
packed by sequence length under a token budget, and an LR scheduler that scales the learning rate
of each batch by its size.

As in DeepSpeed this is a library the script calls; the engine never reads
``data_efficiency.data_sampling.dynamic_batching`` itself. The script calls
``get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(dataset, engine, ...)`` (the
settings from that config section and the engine) or the plain
``get_dataloader_and_lr_scheduler_for_variable_batch_size(...)`` and trains with the returned
dataloader and scheduler.

Packing (``batch_by_seqlens``), for the same inputs and seed, gives DeepSpeed's micro-batches:

- the samples are taken in ``sequence_picking_order``: ``dataloader`` (as given), ``random``
  (``random.Random(seed).shuffle``) or ``seqlen`` (ascending (length, id));
- a sample longer than ``max_tokens`` is dropped (a warning names it);
- from the first sample not yet packed, a batch of ``k * m`` consecutive samples is dealt round
  robin into ``m`` micro-batches (``m`` = ``effective_batch_size`` when
  ``required_microbatches_of_same_size``, else 1), for the largest ``k`` whose micro-batches all
  hold ``min_batch_size..max_batch_size`` samples and at most ``max_tokens`` tokens; the end of
  such a batch stops before the last sample of the list (DeepSpeed's range), and packing ends at
  the first start where no batch fits;
- the micro-batches are cut to a multiple of ``effective_batch_size``; each run of
  ``effective_batch_size`` of them is one batch, with its sample count (``batch_sizes``, what the
  LR is scaled by) and its longest sequence (``batch_max_seqlens``).
"""

from __future__ import annotations

import math
import os
import random

import numpy as np
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, DistributedSampler

from dslaunch.engine.base.log import logger

__all__ = ["batch_by_seqlens", "scale_lr", "dataloader_for_variable_batch_size",
           "VariableBatchSizeLR", "lr_scheduler_for_variable_batch_size",
           "get_dataloader_and_lr_scheduler_for_variable_batch_size",
           "get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed"]
PICKING_ORDERS = ("random", "seqlen", "dataloader")
SEQLEN_METRIC = "seqlen"


def _ordered_samples(seqlens, sequence_ids_per_mb, sequence_picking_order, seed) -> list:
    """[(seqlen, sample id)] in the order the packing takes them."""
    if sequence_ids_per_mb is None:
        pairs = [(length, i) for i, length in enumerate(seqlens)]
    else:
        picked = np.asarray(seqlens)[sequence_ids_per_mb]
        pairs = list(zip(picked, sequence_ids_per_mb))
    if sequence_picking_order == "random":
        random.Random(seed).shuffle(pairs)
    elif sequence_picking_order == "seqlen":
        pairs.sort()
    return pairs


def _deal(samples: list, parts: int) -> list:
    """``samples`` dealt round robin into ``parts`` micro-batches."""
    return [samples[p::parts] for p in range(parts)]


def batch_by_seqlens(seqlens, max_tokens, sequence_ids_per_mb=None, min_batch_size=1,
                     max_batch_size=None, sequence_picking_order="dataloader",
                     effective_batch_size=1, required_microbatches_of_same_size=False,
                     verbose=False, seed=None):
    """Pack samples into micro-batches of at most ``max_tokens`` tokens (the module's docstring
    gives the rule). Returns ``(microbatch_ids, batch_sizes, batch_max_seqlens)``:
    ``microbatch_ids[j] = (batch id, [sample ids])``, ``effective_batch_size`` micro-batches per
    batch; ``batch_sizes[b]`` the number of samples in batch ``b``; ``batch_max_seqlens[b]`` its
    longest sample."""
    if sequence_picking_order not in PICKING_ORDERS:
        raise AssertionError(f"sequence_picking_order {sequence_picking_order!r}; use one of "
                             f"{', '.join(PICKING_ORDERS)}")
    samples = _ordered_samples(seqlens, sequence_ids_per_mb, sequence_picking_order, seed)
    too_long = {i for length, i in samples if length > max_tokens}
    if too_long:
        dropped = [i for length, i in samples if i in too_long]
        logger.warning(f"dynamic batching: samples {dropped} are dropped: each is longer than "
                       f"max_tokens {max_tokens}")
        samples = [s for s in samples if s[1] not in too_long]

    parts = effective_batch_size if required_microbatches_of_same_size else 1

    def fits(mb) -> bool:
        if min_batch_size and len(mb) < min_batch_size:
            return False
        if max_batch_size and len(mb) > max_batch_size:
            return False
        return sum(length for length, _ in mb) <= max_tokens

    def overfull(mb) -> bool:  # stays too big for any longer batch from the same start
        return ((max_batch_size and len(mb) > max_batch_size)
                or sum(length for length, _ in mb) > max_tokens)

    microbatches: list = []
    start, total = 0, len(samples)
    while start < total:
        best = start
        # each longer end adds one sample to every micro-batch, so once one is over the count
        # or the token budget (lengths are >= 0) every later end is too: stop there
        for end in range(start + parts, total, parts):
            mbs = _deal(samples[start:end], parts)
            if all(fits(mb) for mb in mbs):
                best = end
            elif any(overfull(mb) for mb in mbs):
                break
        if best == start:
            break  # nothing fits from here on: the rest is not used
        microbatches.extend(_deal(samples[start:best], parts))
        start = best

    if len(microbatches) < effective_batch_size:
        raise AssertionError(f"dynamic batching: {len(microbatches)} micro-batches, fewer than "
                             f"effective_batch_size {effective_batch_size} (one per dataloader)")
    microbatches = microbatches[:len(microbatches) - len(microbatches) % effective_batch_size]

    microbatch_ids, batch_sizes, batch_max_seqlens = [], [], []
    for batch_id, first in enumerate(range(0, len(microbatches), effective_batch_size)):
        group = microbatches[first:first + effective_batch_size]
        ids = [[i for _, i in mb] for mb in group]
        lengths = [[length for length, _ in mb] for mb in group]
        batch_sizes.append(sum(len(mb) for mb in group))
        batch_max_seqlens.append(max(max(ls) for ls in lengths))
        microbatch_ids.extend((batch_id, mb_ids) for mb_ids in ids)
        if verbose:
            tokens = [sum(ls) for ls in lengths]
            logger.info(f"dynamic batching: batch {batch_id}: {len(group)} micro-batches, "
                        f"{batch_sizes[-1]} samples; samples per micro-batch "
                        f"{[len(mb) for mb in group]}, tokens {tokens}, ids {ids}, "
                        f"lengths {lengths}")
    return microbatch_ids, batch_sizes, batch_max_seqlens


def scale_lr(base_batch_size, batch_size, base_lr=1, method="linear"):
    """``base_lr`` (meant for ``base_batch_size``) scaled to ``batch_size``: ``linear`` (times the
    ratio; Goyal et al.), ``sqrt`` (times its square root; Krizhevsky) or ``none``/None
    (unchanged)."""
    if method == "linear":
        return base_lr * batch_size / base_batch_size
    if method == "sqrt":
        return base_lr * math.sqrt(batch_size / base_batch_size)
    if method is None or method.upper() == "NONE":
        return base_lr
    raise ValueError(f"Unknown scaling method: {method} (use linear, sqrt or none)")


def dataloader_for_variable_batch_size(dataset, microbatch_ids, batch_max_seqlens,
                                       dataloader_rank=0, dataloader_batch_size=1,
                                       dataloader_num_replicas=1, dataloader_collate_fn=None,
                                       dataloader_num_workers=2, dataloader_pin_memory=False,
                                       required_microbatches_of_same_seqlen=False,
                                       sample_padding_fn=None):
    """A ``DataLoader`` over ``microbatch_ids``, dealt to the replicas round robin (a
    ``DistributedSampler``, no shuffle, no drop: short ranks repeat from the start); each item
    holds the samples of ``dataloader_batch_size`` micro-batches, padded to their batch's longest
    sample by ``sample_padding_fn(sample, length)`` when ``required_microbatches_of_same_seqlen``,
    then passed to ``dataloader_collate_fn`` (a plain list without one). Returns
    ``(dataloader, deepspeed_io_kwargs)``: the second, the same loader's parts under DeepSpeed's
    ``engine.deepspeed_io`` argument names."""
    sampler = DistributedSampler(dataset=microbatch_ids, num_replicas=dataloader_num_replicas,
                                 rank=dataloader_rank, shuffle=False, drop_last=False)

    def collate(items):
        samples = []
        for batch_id, ids in items:
            data = [dataset[i] for i in ids]
            if required_microbatches_of_same_seqlen:
                if sample_padding_fn is None:
                    raise AssertionError("dynamic batching: required_microbatches_of_same_seqlen "
                                         "needs sample_padding_fn(sample, length)")
                length = batch_max_seqlens[batch_id]
                if any(len(s) > length for s in data):
                    raise AssertionError(f"dynamic batching: a sample of batch {batch_id} is "
                                         f"longer than its computed longest {length}")
                data = [sample_padding_fn(s, length) for s in data]
            samples.extend(data)
        return dataloader_collate_fn(samples) if dataloader_collate_fn else samples

    dataloader = DataLoader(dataset=microbatch_ids, batch_size=dataloader_batch_size,
                            sampler=sampler, num_workers=dataloader_num_workers,
                            collate_fn=collate, pin_memory=dataloader_pin_memory)
    deepspeed_io_kwargs = {"dataset": microbatch_ids, "batch_size": dataloader_batch_size,
                           "pin_memory": dataloader_pin_memory, "data_sampler": sampler,
                           "collate_fn": collate, "num_local_io_workers": dataloader_num_workers}
    return dataloader, deepspeed_io_kwargs


class VariableBatchSizeLR(LRScheduler):
    """Wraps ``lr_scheduler``: after each of its steps the optimizer's LRs are scaled from
    ``base_batch_size`` to the next batch's size (``batch_sizes``, cycled) by
    ``lr_scaling_method``. ``step(0)`` (done at construction) restarts at the base LRs; a
    ``step()`` steps the wrapped scheduler from its unscaled LRs."""

    @property
    def optimizer(self):
        return self.base_lr_scheduler.optimizer

    def __init__(self, lr_scheduler, base_batch_size, batch_sizes, dataloader,
                 lr_scaling_method="linear", last_epoch=-1, verbose=False):
        # LRScheduler.__init__ is not run: the wrapped scheduler owns the optimizer's steps
        self.base_lr_scheduler = lr_scheduler
        self.base_batch_size, self.batch_sizes = base_batch_size, batch_sizes
        self.lr_scaling_method, self.dataloader = lr_scaling_method, dataloader
        self.base_lrs = lr_scheduler.get_lr()
        self.last_epoch, self.verbose = last_epoch, verbose
        self.step(0)

    def state_dict(self):
        state = {"base_lr_scheduler": self.base_lr_scheduler.state_dict()}
        for key in ("base_batch_size", "lr_scaling_method", "batch_sizes", "base_lrs",
                    "last_epoch", "verbose"):
            state[key] = getattr(self, key)
        return state

    def load_state_dict(self, state_dict):
        self.base_lr_scheduler.load_state_dict(state_dict["base_lr_scheduler"])
        for key in ("base_batch_size", "lr_scaling_method", "batch_sizes", "base_lrs",
                    "last_epoch", "verbose"):
            setattr(self, key, state_dict[key])

    def get_last_lr(self):
        return self.base_lr_scheduler._last_lr

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, epoch=None):
        groups = self.optimizer.param_groups
        unscaled = self.base_lrs if epoch == 0 else self.get_last_lr()
        for group, lr in zip(groups, unscaled):
            group["lr"] = lr  # the wrapped scheduler steps from its own (unscaled) LRs
        self.base_lr_scheduler.step(epoch)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        batch_size = self.batch_sizes[self.last_epoch % len(self.batch_sizes)]
        for group in groups:
            group["lr"] = scale_lr(self.base_batch_size, batch_size, group["lr"],
                                   self.lr_scaling_method)
        if self.verbose:
            logger.info(f"dynamic batching: batch {self.last_epoch}: batch size {batch_size} "
                        f"(base {self.base_batch_size}), LR {unscaled} -> {self.get_lr()}")


class _ConstantLR(LRScheduler):
    """The optimizer's own LRs, unchanged (the base when there is no scheduler)."""

    def get_lr(self):
        return self.base_lrs


def lr_scheduler_for_variable_batch_size(base_batch_size, batch_sizes, dataloader,
                                         lr_scheduler_or_optimizer, lr_scaling_method="linear",
                                         verbose=False):
    """A ``VariableBatchSizeLR`` over ``lr_scheduler_or_optimizer``: a scheduler (anything with
    an ``optimizer`` that is a torch ``Optimizer``), or an optimizer, whose LRs are then held
    constant before scaling."""
    if isinstance(lr_scheduler_or_optimizer, Optimizer):
        base = _ConstantLR(lr_scheduler_or_optimizer)
    elif hasattr(lr_scheduler_or_optimizer, "optimizer"):
        if not isinstance(lr_scheduler_or_optimizer.optimizer, Optimizer):
            raise AssertionError("dynamic batching: the scheduler's optimizer is not a torch "
                                 "Optimizer")
        base = lr_scheduler_or_optimizer
    else:
        raise ValueError(f"Unknown type for lr_scheduler_or_optimizer: "
                         f"{type(lr_scheduler_or_optimizer)}")
    return VariableBatchSizeLR(lr_scheduler=base, base_batch_size=base_batch_size,
                               batch_sizes=batch_sizes, dataloader=dataloader,
                               lr_scaling_method=lr_scaling_method, verbose=verbose)


def get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset, dataset_seqlens, max_tokens, effective_batch_size, dataset_filter_ids=None,
        lr_scaling_method="linear", min_batch_size=1, max_batch_size=None,
        sequence_picking_order="dataloader", dataloader_batch_size=1, dataloader_rank=0,
        dataloader_num_replicas=1, dataloader_num_workers=0, dataloader_collate_fn=None,
        dataloader_pin_memory=False, lr_scheduler_or_optimizer=None,
        required_microbatches_of_same_size=False, required_microbatches_of_same_seqlen=False,
        sample_padding_fn=None, verbose=False, seed=None):
    """``batch_by_seqlens``, then its dataloader and LR scheduler (the base batch size is
    ``effective_batch_size``). Returns ``(dataloader, lr_scheduler, deepspeed_io_kwargs)``."""
    microbatch_ids, batch_sizes, batch_max_seqlens = batch_by_seqlens(
        seqlens=dataset_seqlens, max_tokens=max_tokens, sequence_ids_per_mb=dataset_filter_ids,
        min_batch_size=min_batch_size, max_batch_size=max_batch_size,
        sequence_picking_order=sequence_picking_order, effective_batch_size=effective_batch_size,
        required_microbatches_of_same_size=required_microbatches_of_same_size, verbose=verbose,
        seed=seed)
    dataloader, deepspeed_io_kwargs = dataloader_for_variable_batch_size(
        dataset=dataset, microbatch_ids=microbatch_ids, batch_max_seqlens=batch_max_seqlens,
        dataloader_rank=dataloader_rank, dataloader_num_replicas=dataloader_num_replicas,
        dataloader_batch_size=dataloader_batch_size, dataloader_collate_fn=dataloader_collate_fn,
        dataloader_num_workers=dataloader_num_workers,
        dataloader_pin_memory=dataloader_pin_memory,
        required_microbatches_of_same_seqlen=required_microbatches_of_same_seqlen,
        sample_padding_fn=sample_padding_fn)
    lr_scheduler = lr_scheduler_for_variable_batch_size(
        base_batch_size=effective_batch_size, batch_sizes=batch_sizes, dataloader=dataloader,
        lr_scheduler_or_optimizer=lr_scheduler_or_optimizer,
        lr_scaling_method=lr_scaling_method, verbose=verbose)
    return dataloader, lr_scheduler, deepspeed_io_kwargs


def _analyzed_seqlens(dataset, engine, metrics_path, batch_seqlens_fn, collate_fn):
    """Every sample's length from the data analyzer's ``seqlen`` files under ``metrics_path``,
    writing them first (every rank a share of the map, rank 0 the reduce) when absent."""
    from dslaunch.engine.features.data_efficiency.data_analyzer import DataAnalyzer
    from dslaunch.engine.features.data_efficiency.indexed_dataset import MMapIndexedDataset

    if not metrics_path:
        raise ValueError("dynamic batching: give dataset_seqlens, or set "
                         "data_efficiency.data_sampling.dynamic_batching.metrics_path (where the "
                         "data analyzer's seqlen files are or are written)")
    prefix = os.path.join(metrics_path, SEQLEN_METRIC, f"{SEQLEN_METRIC}_sample_to_metric")
    if not (os.path.exists(f"{prefix}.bin") and os.path.exists(f"{prefix}.idx")):
        logger.warning(f"dynamic batching: no sequence-length files {prefix}.bin/.idx; running "
                       "the data analyzer to write them")
        if batch_seqlens_fn is None:
            raise ValueError("dynamic batching: batch_seqlens_fn must be given when neither "
                             "dataset_seqlens nor the metric files are")
        import torch

        DataAnalyzer(dataset, num_workers=engine.world_size, worker_id=engine.global_rank,
                     batch_size=2**10, metric_names=[SEQLEN_METRIC],
                     metric_functions=[batch_seqlens_fn],
                     metric_types=["single_value_per_sample"], metric_dtypes=[torch.long],
                     save_path=str(metrics_path), collate_fn=collate_fn).run_map_reduce()
    seqlens = MMapIndexedDataset(prefix, skip_warmup=True)
    if len(seqlens) != len(dataset):
        raise AssertionError(f"dynamic batching: {len(seqlens)} lengths in {prefix}, "
                             f"{len(dataset)} samples in the dataset (delete {metrics_path} "
                             "after changing the dataset)")
    return np.array(list(seqlens), dtype=np.int64).flatten()


def get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        dataset, engine, dataset_seqlens=None, dataset_filter_ids=None,
        dataloader_collate_fn=None, sample_padding_fn=None, batch_seqlens_fn=None):
    """``get_dataloader_and_lr_scheduler_for_variable_batch_size`` with its settings from
    ``engine``: the config's ``data_efficiency.data_sampling.dynamic_batching`` (which must be
    enabled), ``num_workers``/``pin_memory``, ``data_efficiency.seed``; the effective batch size
    is ``engine.train_batch_size()``, the loader's ``engine.train_micro_batch_size_per_gpu()``,
    one loader per data-parallel rank; the base LRs are the engine's scheduler's (else its
    optimizer's); a pipeline engine gets micro-batches of equal count and padded length.
    The lengths: ``dataset_seqlens``, else the analyzer's files under ``metrics_path`` (written
    with ``batch_seqlens_fn`` when absent)."""
    from dslaunch.config.data_efficiency import data_efficiency_config

    full = data_efficiency_config(engine.config.get("data_efficiency"))
    sampling = full["data_sampling"]
    batching = sampling["dynamic_batching"]
    if not batching.get("enabled"):
        raise AssertionError("Dynamic batching is not enabled in the config "
                             "(data_efficiency.data_sampling.dynamic_batching.enabled)")
    if dataset_seqlens is None:
        dataset_seqlens = _analyzed_seqlens(dataset, engine, batching.get("metrics_path"),
                                            batch_seqlens_fn, dataloader_collate_fn)

    pipeline = getattr(engine, "pipeline_parallelism", False)  # (DeepSpeed's engine attribute)
    rank = engine.global_rank if engine._dp_rank is None else engine._dp_rank
    optimizer = engine.optimizer
    if engine.lr_scheduler is None and not isinstance(optimizer, Optimizer):
        optimizer = getattr(optimizer, "optimizer", optimizer)  # a ZeRO wrapper: its torch one
    return get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset=dataset, dataset_filter_ids=dataset_filter_ids, dataset_seqlens=dataset_seqlens,
        effective_batch_size=engine.train_batch_size(), max_tokens=batching["max_tokens"],
        lr_scaling_method=batching["lr_scaling_method"],
        sequence_picking_order=batching["sequence_picking_order"],
        min_batch_size=batching["min_batch_size"], max_batch_size=batching["max_batch_size"],
        dataloader_batch_size=engine.train_micro_batch_size_per_gpu(), dataloader_rank=rank,
        dataloader_num_replicas=engine.dp_world_size,
        dataloader_num_workers=sampling["num_workers"],
        dataloader_collate_fn=dataloader_collate_fn,
        dataloader_pin_memory=sampling["pin_memory"], sample_padding_fn=sample_padding_fn,
        lr_scheduler_or_optimizer=engine.lr_scheduler or optimizer,
        required_microbatches_of_same_size=pipeline,
        required_microbatches_of_same_seqlen=pipeline,
        verbose=batching["verbose"], seed=full["seed"])
