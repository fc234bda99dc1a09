"""How a ZeRO 1-3 strategy takes the NVMe path: ``offload_optimizer: {device: nvme}``.

``with_nvme_swap(cls)`` is the stage's class run exactly as with ``device: cpu`` (fp32 gradient
shard on the CPU, the step there, with the compiled CPU Adam when it applies), but with its
optimizer wrapped in ``NVMeSwappedOptimizer`` (``optimizer.py``): the optimizer's states, and its
parameters (the fp32 master shard, ``masters.py``), are kept in swap files per rank under
``nvme_path/dslaunch-<host>-<pid>/rank<r>/`` (``swap_dir.py``).

The masters are written to their file when the strategy is built. After the step the strategy
needs the new values (stages 1-2 all-gather them, stage 3 writes its parameter shard): it reads
them back sub-group by sub-group (``iter_params``). Everything else that reads or writes the
masters (checkpoint save and load, ``load_resharded``, ``sync_from_model``, stage 3's
``release_params`` with a ``modifier_rank``) runs inside the strategy's ``masters_in(write=...)``:
``g.master`` is allocated and filled from the file for the block (as much memory as CPU offload,
for that long) and written back after it. Checkpoints are those of CPU offload: saving reads the
states back into ordinary tensors for the shard writer; loading writes the loaded states to the
file.
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.engine.zero.nvme.masters import storageless_like
from dslaunch.engine.zero.nvme.optimizer import NVMeSwappedOptimizer
from dslaunch.engine.zero.nvme.swap_dir import KEY, make_swap_dir
from dslaunch.engine.zero.nvme.swap_file import aio_settings


def wrap_optimizer(optimizer, zero, aio, rank: int, swap_params: bool = False):
    """The NVMe wrapper around a strategy's CPU optimizer, from the ``zero_optimization`` and
    ``aio`` sections (``swap_params``: the optimizer's parameters, the fp32 master shard, go to
    the swap directory too)."""
    section = zero.offload_optimizer
    rank_dir = make_swap_dir(section.nvme_path, rank)
    return NVMeSwappedOptimizer(optimizer, rank_dir, sub_group_size=zero.sub_group_size,
                                buffer_count=section.buffer_count, aio=aio_settings(aio),
                                swap_params=swap_params)


def with_nvme_swap(cls):
    """A subclass of the ZeRO 1-3 strategy ``cls`` whose optimizer states live on NVMe. The
    strategy runs its CPU-offload path; only its optimizer, checkpoint and accounting change."""

    class NVMeOffload(cls):
        def __init__(self, model, optimizer, zero, comm, precision, aio):
            super().__init__(model, optimizer, zero, comm, precision, aio=aio)
            if not self.offload_optimizer:
                raise RuntimeError(f"{KEY}.device: nvme, but {cls.__name__} did not take the "
                                   "offload path")
            # the optimizer steps views of the fp32 master shard: those go to the file too
            ours = {id(sp) for g in self.groups for sp in g.shard_params}
            steps = [p for g in self.optimizer.param_groups for p in g["params"]]
            swap_params = self.need_master and len(steps) == len(ours) and all(
                id(p) in ours for p in steps)
            self.masters_resident = not swap_params
            self.optimizer = wrap_optimizer(self.optimizer, zero, aio, self.rank, swap_params)
            if swap_params:
                for g in self.groups:
                    g.master = storageless_like(g.master)

        @contextlib.contextmanager
        def masters_in(self, write: bool = False):
            """The fp32 master shard in memory (``g.master``, the optimizer's parameters views of
            it, as with CPU offload) while the block runs; ``write``: back to the file after it.
            Every reader or writer of the masters outside the step goes through this."""
            if self.masters_resident:
                yield self
                return
            from dslaunch.engine.base import partition as P

            for g in self.groups:
                g.master = torch.empty(g.layout.shard_numel, dtype=torch.float32)
                for sp, view in zip(g.shard_params, P.shard_chunks(g.master, g.layout)):
                    sp.data = view
            self.masters_resident = True
            try:
                self.optimizer.load_params()
                yield self
                if write:
                    self.optimizer.store_params()
            finally:
                self.masters_resident = False
                self.optimizer.park_params()
                for g in self.groups:
                    g.master = storageless_like(g.master)

        def state_dict(self):
            with self.optimizer.swapped_in(), self.masters_in():
                return super().state_dict()

        def load_state_dict(self, sd, load_optimizer_states: bool = True):
            with self.masters_in(write=True):
                super().load_state_dict(sd, load_optimizer_states)
            self.optimizer.absorb()

        def load_resharded(self, ckpt_path):
            with self.masters_in(write=True):
                super().load_resharded(ckpt_path)
            self.optimizer.absorb()

        def sync_from_model(self):
            with self.masters_in(write=True):
                super().sync_from_model()

        if hasattr(cls, "release_params"):
            def release_params(self, handle, modifier_rank=None):
                if modifier_rank is None:  # the masters are not touched
                    return super().release_params(handle, modifier_rank)
                with self.masters_in(write=True):
                    return super().release_params(handle, modifier_rank)

        def memory_breakdown(self) -> dict:
            """The CPU-offload breakdown (swapped states and masters hold no storage), plus the
            swap buffers (cpu) and the swap files (nvme) under "optimizer"."""
            out = super().memory_breakdown()
            stats = self.optimizer.swap_stats()
            extra = {"cpu": self.optimizer.buffer_bytes(),
                     "nvme": stats["file_bytes"] + stats["master_file_bytes"]}
            for kind in ("optimizer", "total"):
                for dev, n in extra.items():
                    out[kind][dev] = out[kind].get(dev, 0) + n
            return out

    NVMeOffload.__name__ = NVMeOffload.__qualname__ = f"{cls.__name__}NVMe"
    return NVMeOffload
