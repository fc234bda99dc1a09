"""ZeRO-Infinity parameter offload: stage 3's parameter shard lives in a file, not in memory.

With ``offload_param: {device: nvme, nvme_path: DIR}`` this rank's chunk of every bucket (in the
training dtype) is kept in ``DIR/dslaunch-<host>-<pid>/rank<r>/params.swp`` (the directory the
optimizer swap uses too, ``swap_dir.py``: removed at exit, on SIGTERM, or by the next job after a
SIGKILL), one 4 KiB-aligned range per bucket chunk, moved with one ``AsyncIOHandle`` built from the
config's ``aio`` section (``swap_file.py``).

- ``max_in_cpu``: up to this many shard elements stay in CPU memory instead (persistent buckets
  first, which are re-gathered after every step, then buckets in layout order); DeepSpeed's
  meaning of the key. Its default (1e9) keeps every shard of a small model in memory: set it
  lower (0: everything on NVMe) to move the parameters out.
- ``buffer_count`` page-aligned CPU buffers, each as big as the largest chunk on file, are where
  chunks are read to (the all-gather's input) and written from. ``buffer_size`` (elements) is the
  most a buffer may hold: a chunk bigger than it is a clear error naming the key.
- Reads: gathering a bucket reads its chunk (or takes it from a buffer a read-ahead filled) and
  keeps the buffer until the all-gather is done. ``read_ahead`` (told the next units by
  ``FetchCoordinator``, past those whose all-gathers are already in flight) starts async reads
  into free buffers.
- Writes: after the optimizer step the strategy writes the new shard (from its fp32 masters,
  which ``offload_param: nvme`` always keeps) chunk by chunk, ``buffer_count`` writes in flight;
  buffers read ahead before the step are dropped first (their values are stale).

CPU memory for the parameters is then the buffers plus what ``max_in_cpu`` keeps; the gathered
(``full``) buckets are the same as without offload.
"""

from __future__ import annotations

import os
import shutil
import time
import weakref

import torch

from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir, remove_swap_dir
from dslaunch.engine.zero.nvme.swap_file import aio_settings, open_aio_handle, round_up
from dslaunch.engine.zero.stage3_fetch import RELEASED, ParamStore

KEY = "zero_optimization.offload_param"


def nvme_param_store(plan, dtype, device, comm, offload_param, aio, rank: int) -> "NVMeParamStore":
    """The store for ``offload_param: {device: nvme}``, from the typed ``offload_param`` and
    ``aio`` sections."""
    swap_dir = make_swap_dir(offload_param.nvme_path, rank, key=KEY)
    return NVMeParamStore(plan, dtype, device, comm, swap_dir,
                          buffer_count=offload_param.buffer_count,
                          buffer_size=offload_param.buffer_size,
                          max_in_cpu=offload_param.max_in_cpu, aio=aio_settings(aio))


class NVMeParamStore(ParamStore):
    def __init__(self, plan, dtype, device, comm, swap_dir: str, *, buffer_count: int = 5,
                 buffer_size: int = int(1e8), max_in_cpu: int = int(1e9), aio: dict | None = None):
        if buffer_count < 1:
            raise ValueError(f"{KEY}.buffer_count: {buffer_count}; NVMe parameter offload needs "
                             "at least 1 buffer")
        self.io = open_aio_handle(aio, KEY)
        self.swap_dir = swap_dir
        self.path = os.path.join(swap_dir, "params.swp")
        self.buffer_count, self.buffer_size = buffer_count, buffer_size
        self.max_in_cpu = max_in_cpu
        self.stats = {"read_bytes": 0, "write_bytes": 0, "reads": 0, "read_ahead": 0,
                      "read_ahead_used": 0, "io_wait_seconds": 0.0}
        weakref.finalize(self, _close, self.io, swap_dir)
        super().__init__(plan, dtype, device, torch.device("cpu"), comm)

    # -- layout -----------------------------------------------------------------------------------
    def _make_shards(self):
        """Which chunks stay in memory (``max_in_cpu``), where the others sit in the file, and
        the buffers they pass through."""
        self.local, self.chunks = None, None
        self.elem = torch.empty((), dtype=self.dtype).element_size()
        numel = {(gi, bi): b.chunk(lay.world_size)
                 for gi, lay in enumerate(self.plan.layouts) for bi, b in enumerate(lay.buckets)}
        order = sorted(self.plan.persistent) + sorted(k for k in numel
                                                      if k not in self.plan.persistent)
        self.cpu, self.offset, kept, at = {}, {}, 0, 0
        for k in order:
            if kept + numel[k] <= self.max_in_cpu:
                self.cpu[k] = torch.zeros(numel[k], dtype=self.dtype)
                kept += numel[k]
            else:
                self.offset[k] = at
                at += round_up(numel[k] * self.elem)
        self.numel, self.file_bytes = numel, at
        biggest = max((numel[k] for k in self.offset), default=0)
        if biggest > self.buffer_size:
            raise ValueError(f"{KEY}.buffer_size: {self.buffer_size} elements, but a parameter "
                             f"chunk on NVMe has {biggest}; raise buffer_size to at least that "
                             "(or lower zero_optimization.reduce_bucket_size)")
        n = min(self.buffer_count, len(self.offset))
        self.buffers = [self.io.new_cpu_locked_tensor(biggest, self.dtype) for _ in range(n)]
        self.holder = [None] * n  # buffer -> the key whose chunk it holds
        self.in_use = set()  # keys whose buffer an all-gather still reads
        self.reading = set()  # keys with an async read in flight
        self._allocate_file()

    def _allocate_file(self) -> None:
        free = shutil.disk_usage(self.swap_dir).free
        if free < self.file_bytes:
            raise ValueError(f"{KEY}.nvme_path: {self.file_bytes / 2**30:.2f} GiB needed for this "
                             f"rank's parameter shard, {free / 2**30:.2f} GiB free in "
                             f"{self.swap_dir}; free space or point nvme_path at a larger drive")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(self.file_bytes, 1))
        except OSError as exc:
            raise ValueError(f"{KEY}.nvme_path: cannot reserve {self.file_bytes} bytes in "
                             f"{self.path}: {exc.strerror}") from None
        finally:
            os.close(fd)

    # -- buffers ----------------------------------------------------------------------------------
    def _view(self, slot, key) -> torch.Tensor:
        return self.buffers[slot][: self.numel[key]]

    def _wait_io(self) -> None:
        """Wait for every read and write in flight (time counted as the training's wait)."""
        t = time.perf_counter()
        self.io.wait()
        self.stats["io_wait_seconds"] += time.perf_counter() - t
        self.reading.clear()

    def _free(self, key) -> None:
        if key in self.holder:
            if key in self.reading:
                self._wait_io()
            self.holder[self.holder.index(key)] = None
            self.in_use.discard(key)

    def _slot(self) -> int:
        """A free buffer, made free if need be: drop the read-ahead furthest ahead, else wait for
        the oldest all-gather still reading a buffer."""
        while None not in self.holder:
            ahead = [k for k in self.holder if k not in self.in_use]
            if ahead:
                self._free(ahead[-1])
                continue
            busy = [k for k in self.work if k in self.in_use]
            if not busy:
                raise RuntimeError(f"{KEY}: all {len(self.buffers)} parameter swap buffers are "
                                   "held; raise buffer_count")
            self.wait(busy[0])
        return self.holder.index(None)

    def _read(self, key, async_op: bool) -> int:
        slot = self._slot()
        self.holder[slot] = key
        if async_op:
            self.io.async_pread(self._view(slot, key), self.path, self.offset[key])
            self.reading.add(key)
        else:  # the training waits for this one
            t = time.perf_counter()
            self.io.sync_pread(self._view(slot, key), self.path, self.offset[key])
            self.stats["io_wait_seconds"] += time.perf_counter() - t
        self.stats["read_bytes"] += self.numel[key] * self.elem
        self.stats["reads"] += 1
        return slot

    # -- the seam ---------------------------------------------------------------------------------
    def _chunk(self, key) -> torch.Tensor:
        """Bucket ``key``'s chunk in memory: its CPU copy, or a buffer (held until _free)."""
        if key in self.cpu:
            return self.cpu[key]
        if key in self.holder:
            slot = self.holder.index(key)
            if key in self.reading:
                self._wait_io()
            if key not in self.in_use:
                self.stats["read_ahead_used"] += 1
        else:
            slot = self._read(key, async_op=False)
        self.in_use.add(key)
        return self._view(slot, key)

    def _source(self, key) -> torch.Tensor:
        src = self._chunk(key)
        if src.device != self.device:  # copied now: the buffer is free again at once
            src = src.to(self.device)
            self._free(key)
        return src

    def _source_done(self, key) -> None:
        if key not in self.cpu:
            self._free(key)

    def read_ahead(self, keys) -> None:
        for k in keys:
            if k in self.cpu or k in self.holder or self.state[k] != RELEASED:
                continue
            if None not in self.holder:
                return  # no eviction for a guess
            self._read(k, async_op=True)
            self.stats["read_ahead"] += 1

    @property
    def read_ahead_depth(self) -> int:
        return len(self.buffers)

    def chunk_views(self, gi) -> list:
        lay = self.plan.layouts[gi]
        return [self.cpu[(gi, bi)] if (gi, bi) in self.cpu else
                torch.empty(self.numel[(gi, bi)], dtype=self.dtype, device="meta")
                for bi in range(len(lay.buckets))]

    def local_shards(self) -> list:
        return [self.read_shard(gi) for gi in range(len(self.plan.layouts))]

    def read_shard(self, gi) -> torch.Tensor:
        parts = []
        for bi in range(len(self.plan.layouts[gi].buckets)):
            key = (gi, bi)
            busy = key in self.in_use  # an all-gather still reads that buffer: leave it be
            parts.append(self._chunk(key).clone())
            if not busy:
                self._source_done(key)
        return torch.cat(parts)

    def _drop_read_ahead(self) -> None:
        """Chunks read before new values are written are stale."""
        for k in [k for k in self.holder if k is not None and k not in self.in_use]:
            self._free(k)

    def write_chunk(self, key, values) -> None:
        if key in self.cpu:
            self.cpu[key].copy_(values.reshape(-1))
            return
        self._drop_read_ahead()
        slot = self._slot()
        view = self._view(slot, key)
        view.copy_(values.reshape(-1))
        self.io.sync_pwrite(view, self.path, self.offset[key])
        self.stats["write_bytes"] += view.numel() * self.elem

    def write_shard(self, gi, values) -> None:
        """Chunk by chunk, up to one write per buffer in flight."""
        self._drop_read_ahead()
        offsets = self.plan.layouts[gi].shard_offsets()
        free, pending = None, 0
        for bi, off in enumerate(offsets):
            key = (gi, bi)
            src = values[off: off + self.numel[key]]
            if key in self.cpu:
                self.cpu[key].copy_(src)
                continue
            if free is None:  # (none when max_in_cpu keeps the whole shard: no buffers then)
                free = [i for i, k in enumerate(self.holder) if k is None] or [self._slot()]
            if pending == len(free):
                self._wait_io()
                pending = 0
            view = self._view(free[pending], key)
            view.copy_(src)
            self.io.async_pwrite(view, self.path, self.offset[key])
            self.stats["write_bytes"] += view.numel() * self.elem
            pending += 1
        self._wait_io()

    def resident_tensors(self) -> list:
        return list(self.cpu.values()) + list(self.buffers)

    def nvme_bytes(self) -> int:
        return self.file_bytes

    def swap_stats(self) -> dict:
        """Where the shard is and what moved (for tests and benchmarks)."""
        return {"path": self.path, "file_bytes": self.file_bytes,
                "on_nvme_numel": sum(self.numel[k] for k in self.offset),
                "in_cpu_numel": sum(self.numel[k] for k in self.cpu),
                "buffers": len(self.buffers),
                # what the buffers' allocations hold (a page more each, for the alignment)
                "buffer_bytes": sum(b.untyped_storage().nbytes() for b in self.buffers),
                "backend": self.io.backend, **self.stats}


def _close(io, swap_dir) -> None:
    try:
        io.wait()
    except OSError:
        pass
    remove_swap_dir(swap_dir)
