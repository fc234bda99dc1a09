"""The engine's side of curriculum data sampling (``data_efficiency.data_sampling``; the sampler
itself: ``engine/features/data_efficiency/data_sampler.py``).

As in DeepSpeed 0.19.8, ``data_sampling.curriculum_learning.enabled`` makes ``deepspeed_io``
(and so ``initialize(training_data=...)``) serve the data through ``DeepSpeedDataSampler``:

- the loader's batches are this rank's share of curriculum global batches; before a batch is
  handed out, ``engine.set_data_post_process_func(fn)``'s ``fn(data, sampler.state_dict())`` may
  change it (Megatron-DeepSpeed truncates sequences to ``state["current_difficulties"]``);
  the model's forward gets nothing extra (the new-style config has no ``curriculum_seqlen``);
- ``engine.set_custom_curriculum_learning_schedule({metric: fn})`` sets custom schedules;
- the checkpoint's model states hold the sampler's state under ``data_sampler`` (DeepSpeed's
  key), and a load restores it, so the resumed run serves the same order.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from dslaunch.config.data_efficiency import curriculum_sampling_enabled, data_efficiency_config
from dslaunch.engine.features.data_efficiency.data_sampler import CLUSTERS_KEY, DeepSpeedDataSampler


class CurriculumDataLoader:
    """DeepSpeed's ``DeepSpeedDataLoader`` in its curriculum mode: a ``DataLoader`` driven by
    ``data_sampler`` as its batch sampler, with ``post_process_func`` applied to each batch.
    A new ``iter()`` continues where the sampler is (it is not an epoch restart)."""

    def __init__(self, dataset, data_sampler, batch_size, collate_fn=None, num_workers=0,
                 pin_memory=False, drop_last=True):
        self.dataset, self.data_sampler = dataset, data_sampler
        self.batch_size, self.collate_fn = batch_size, collate_fn
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.post_process_func = None
        total = len(data_sampler)
        self.len = total // batch_size if drop_last else -(-total // batch_size)
        self.dataloader, self.data_iterator = None, None

    def __len__(self) -> int:
        return self.len

    def __iter__(self):
        self.dataloader = DataLoader(self.dataset, batch_sampler=self.data_sampler,
                                     collate_fn=self.collate_fn, num_workers=self.num_workers,
                                     pin_memory=self.pin_memory)
        self.data_iterator = iter(self.dataloader)
        return self

    def __next__(self):
        if self.data_iterator is None:
            iter(self)
        data = next(self.data_iterator)
        if self.post_process_func is not None:
            data = self.post_process_func(data, self.data_sampler.state_dict())
        return data


def uses_curriculum_sampling(engine) -> bool:
    return curriculum_sampling_enabled(engine.config.get("data_efficiency"))


def curriculum_dataloader(engine, dataset, batch_size=None, collate_fn=None):
    full = data_efficiency_config(engine.config.get("data_efficiency"))
    rank = engine.global_rank if engine._dp_rank is None else engine._dp_rank
    batch_size = batch_size or engine._micro_batch
    sampler = DeepSpeedDataSampler(full, len(dataset), batch_size, rank, engine.dp_world_size,
                                   None, engine.gradient_accumulation_steps(),
                                   engine.global_rank, drop_last=bool(engine.config.get("dataloader_drop_last", False)))
    sampling = full["data_sampling"]
    return CurriculumDataLoader(dataset, sampler, batch_size, collate_fn,
                                num_workers=sampling["num_workers"],
                                pin_memory=sampling["pin_memory"],
                                drop_last=bool(engine.config.get("dataloader_drop_last", False)))


def _curriculum_loader(engine):
    loader = getattr(engine, "training_dataloader", None)
    return loader if isinstance(loader, CurriculumDataLoader) else None


def sampler_state(engine):
    """What the checkpoint keeps under ``data_sampler`` (None without curriculum sampling):
    the sampler's state with its numpy arrays as tensors (checkpoints load weights-only)."""
    loader = _curriculum_loader(engine)
    if loader is None:
        return None
    state = dict(loader.data_sampler.state_dict())
    name, keys, pos, has_gauss, cached = state["np_rng_state"]
    state["np_rng_state"] = (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos,
                             has_gauss, cached)
    state[CLUSTERS_KEY] = [torch.from_numpy(np.asarray(c, dtype=np.int64))
                           for c in state[CLUSTERS_KEY]]
    return state


def load_sampler_state(engine, state) -> None:
    loader = _curriculum_loader(engine)
    if loader is None or state is None:
        return
    state = dict(state)
    name, keys, pos, has_gauss, cached = state["np_rng_state"]
    state["np_rng_state"] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
    if CLUSTERS_KEY in state:
        state[CLUSTERS_KEY] = [np.asarray(c) for c in state[CLUSTERS_KEY]]
    loader.data_sampler.load_state_dict(state)


class DataSamplingSurface:
    """DeepSpeed's engine methods of data sampling; mixed into the engine."""

    def set_data_post_process_func(self, post_process_func) -> None:
        if self.training_dataloader is not None:
            self.training_dataloader.post_process_func = post_process_func

    def data_efficiency_enabled(self) -> bool:
        return (self.config.get("data_efficiency") or {}).get("enabled") is True

    def data_efficiency_config(self) -> dict:
        return data_efficiency_config(self.config.get("data_efficiency"))

    def data_sampling_enabled(self) -> bool:
        return self.data_efficiency_config()["data_sampling"]["enabled"] is True

    def data_sampling_config(self) -> dict:
        return self.data_efficiency_config()["data_sampling"]

    def curriculum_learning_enabled(self) -> bool:
        return uses_curriculum_sampling(self)

    def curriculum_learning_config(self) -> dict:
        return self.data_sampling_config()["curriculum_learning"]
