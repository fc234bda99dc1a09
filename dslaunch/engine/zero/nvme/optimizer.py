"""The swapped optimizer: its per-element states live in a file, stepped sub-group by sub-group.

``NVMeSwappedOptimizer`` wraps the CPU optimizer of a ZeRO 1-3 strategy on the NVMe path
(``strategy.py``). The optimizer's per-element states (Adam's exp_avg and exp_avg_sq, ...) are
kept in ``optimizer_states.swp`` in the rank's swap directory (``swap_dir.py``); with
``swap_params`` its parameters, the fp32 master shard, are in ``fp32_master.swp`` there too
(``masters.py``). Between steps the state entries of the optimizer are ``meta`` tensors and its
parameters CPU tensors without storage: the CPU holds only the swap buffers.

The step walks the shard parameters in sub-groups of about ``sub_group_size`` elements. Sub-group
``i``'s states (and masters, in a second set of buffers) are in buffer ``i % buffer_count``;
while it is stepped, the next sub-group is read (async pread) into its buffer and the previous one
written back (async pwrite), through one ``AsyncIOHandle`` built from the config's ``aio``
section. Each sub-group is one contiguous, 4 KiB-aligned range of the file, so each transfer is
one large request (O_DIRECT where the file system accepts it). The first step lets the optimizer
create its states sub-group by sub-group (so even then no more than one sub-group's states exist
in plain memory) and learns from them what to swap: every state tensor with as many elements as
its parameter.

CPU memory for the states is ``buffer_count`` x (the largest sub-group's states), about
``buffer_count * sub_group_size * 8`` bytes for fp32 Adam, plus
``buffer_count * sub_group_size * 4`` for the masters (a sub-group holds whole shard chunks, so it
can exceed ``sub_group_size`` by up to one chunk); buffers are page-aligned and mlock'ed where
RLIMIT_MEMLOCK allows (``pin_memory``; CUDA-pinned when CUDA is there). With one buffer nothing
overlaps; with two the prefetch waits for the previous write-back. DeepSpeed's
``pipeline_read``/``pipeline_write``/``fast_init``/``ratio`` are accepted and not used: reads and
writes always overlap the step when there are two buffers or more, and all states are swapped.

Checkpoints are those of CPU offload: ``swapped_in`` reads the states back into ordinary tensors
for the shard writer; ``absorb`` writes loaded states to the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import weakref

import torch

from dslaunch.engine.zero.nvme.masters import SwappedMasters
from dslaunch.engine.zero.nvme.swap_dir import KEY, remove_swap_dir
from dslaunch.engine.zero.nvme.swap_file import AIO_KEYS, open_aio_handle, round_up


class _SubGroup:
    """A run of consecutive shard parameters whose states share one contiguous file range."""

    def __init__(self, params):
        self.params = params
        self.file_offset = 0
        self.nbytes = 0
        self.offsets: dict = {}  # param -> byte offset of its first state inside the range
        self.m_offset = 0  # the same for the fp32 master values (their own file)
        self.m_nbytes = 0
        self.m_offsets: dict = {}


class NVMeSwappedOptimizer(SwappedMasters, torch.optim.Optimizer):
    """Steps ``inner`` (an optimizer over CPU shard parameters) sub-group by sub-group with its
    per-element states swapped between a file in ``swap_dir`` and ``buffer_count`` CPU buffers.

    ``param_groups`` and ``state`` are the inner optimizer's own objects, so LR schedules and the
    shard checkpoint code see them; swapped-out state entries are ``meta`` tensors."""

    def __init__(self, inner, swap_dir: str, sub_group_size: int = int(1e9), buffer_count: int = 4,
                 aio: dict | None = None, key: str = KEY, swap_params: bool = False):
        for group in inner.param_groups:
            for p in group["params"]:
                if p.device.type != "cpu":
                    raise ValueError(f"{key}.device: nvme offload steps CPU shards, but a "
                                     f"parameter is on {p.device}")
        self.inner = inner
        self.key = key
        self.swap_dir = swap_dir
        self.path = os.path.join(swap_dir, "optimizer_states.swp")
        aio = {k: v for k, v in (aio or {}).items() if k in AIO_KEYS}
        self.io = open_aio_handle(aio, key)
        torch.optim.Optimizer.__init__(self, inner.param_groups, inner.defaults)
        self.param_groups = inner.param_groups  # the same dicts: schedules drive the inner one
        self.state = inner.state
        self.buffer_count = max(1, int(buffer_count))
        params = [p for g in inner.param_groups for p in g["params"]]
        self.subgroups = _split(params, max(1, int(sub_group_size)))
        self.spec = None  # [(state name, dtype)] swapped for every parameter, once known
        self.buffers: list = []
        self.swapped: set = set()  # params whose states live in the file
        self.stats = {"read_bytes": 0, "write_bytes": 0, "io_wait_seconds": 0.0,
                      "step_seconds": 0.0, "steps": 0}
        self._sg_of = {p: i for i, sg in enumerate(self.subgroups) for p in sg.params}
        weakref.finalize(self, remove_swap_dir, swap_dir)
        self.swap_params = bool(swap_params)
        self.master_path = os.path.join(swap_dir, "fp32_master.swp")
        self.master_buffers: list = []
        self.master_file_bytes = 0
        self.stats.update(master_read_bytes=0, master_write_bytes=0)
        if self.swap_params:
            self._adopt_params()

    # -- layout ---------------------------------------------------------------------------------
    def _learn_spec(self, p) -> None:
        st = self.inner.state.get(p) or {}
        spec = [(k, v.dtype) for k, v in st.items() if _per_element(v, p)]
        if self.spec is None:
            self.spec = spec
            self._build_layout()
        elif sorted(spec, key=_name) != sorted(self.spec, key=_name):
            raise RuntimeError(f"{self.key}.device: nvme offload needs the same per-element "
                               f"states for every parameter; got {[k for k, _ in spec]} after "
                               f"{[k for k, _ in self.spec]}")

    def _param_bytes(self, p) -> list:
        return [round_up(p.numel() * torch.empty((), dtype=dt).element_size())
                for _, dt in self.spec]

    def _build_layout(self) -> None:
        plan, self.file_bytes, self.buffers = self._lay_out_file(
            lambda p: sum(self._param_bytes(p)), self.path)
        for sg, (start, offsets, nbytes) in zip(self.subgroups, plan):
            sg.file_offset, sg.nbytes = start, nbytes
            sg.offsets.update(offsets)

    def _lay_out_file(self, bytes_of, path: str):
        """Place the sub-groups back to back in a new file at `path`, each parameter's bytes
        (`bytes_of(p)`, page-rounded) after the previous one's. Returns per sub-group (start,
        {param: offset inside it}, bytes), the file's size, and the page-aligned I/O buffers (each
        big enough for the largest sub-group)."""
        plan, offset = [], 0
        for sg in self.subgroups:
            offsets, inner = {}, 0
            for p in sg.params:
                offsets[p] = inner
                inner += bytes_of(p)
            plan.append((offset, offsets, inner))
            offset += inner
        biggest = max(nbytes for _, _, nbytes in plan)
        buffers = [self.io.new_cpu_locked_tensor(biggest, torch.uint8)
                   for _ in range(min(self.buffer_count, len(self.subgroups)))]
        self._allocate_file(offset, path)
        return plan, offset, buffers

    def _allocate_file(self, nbytes: int, path: str) -> None:
        """Claim the file's space now, so a full drive is a clear error and not a failed write."""
        free = shutil.disk_usage(self.swap_dir).free
        if free < nbytes:
            raise ValueError(f"{self.key}.nvme_path: {nbytes / 2**30:.2f} GiB needed for this "
                             f"rank's optimizer states, {free / 2**30:.2f} GiB free under "
                             f"{os.path.dirname(os.path.dirname(self.swap_dir))}; free space or "
                             "point nvme_path at a larger drive")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))
        except OSError as exc:
            raise ValueError(f"{self.key}.nvme_path: cannot reserve {nbytes} bytes in "
                             f"{path}: {exc.strerror}") from None
        finally:
            os.close(fd)

    def _views(self, sg, slot: int, p) -> dict:
        """Views of buffer ``slot`` where parameter ``p``'s states sit."""
        buf, at, out = self.buffers[slot], sg.offsets[p], {}
        for (name, dt), nbytes in zip(self.spec, self._param_bytes(p)):
            size = p.numel() * torch.empty((), dtype=dt).element_size()
            out[name] = buf[at: at + size].view(dt).view(p.shape if p.dim() else (1,))
            at += nbytes
        return out

    # -- moving one sub-group -------------------------------------------------------------------
    def _read(self, i: int, slot: int, sync: bool = False, params: bool = False) -> None:
        sg = self.subgroups[i]
        if params and self.swap_params:
            self._read_params(i, slot, sync)
        if self.spec is None or not any(p in self.swapped for p in sg.params):
            return
        for p in sg.params:
            if p in self.swapped:
                self.state[p].update(self._views(sg, slot, p))
        (self.io.sync_pread if sync else self.io.async_pread)(
            self.buffers[slot][: sg.nbytes], self.path, sg.file_offset)
        self.stats["read_bytes"] += sg.nbytes

    def _adopt(self, i: int, slot: int) -> None:
        """States the optimizer just created in plain memory move into buffer ``slot``."""
        sg = self.subgroups[i]
        for p in sg.params:
            st = self.state.get(p)
            if p in self.swapped or not st:
                continue
            self._learn_spec(p)
            for name, view in self._views(sg, slot, p).items():
                view.copy_(st[name].reshape(view.shape))
                st[name] = view
            self.swapped.add(p)

    def _write(self, i: int, slot: int, sync: bool = False, params: bool = False) -> None:
        sg = self.subgroups[i]
        if params and self.swap_params:
            self._write_params(i, slot, sync)
        if not any(p in self.swapped for p in sg.params):
            return
        (self.io.sync_pwrite if sync else self.io.async_pwrite)(
            self.buffers[slot][: sg.nbytes], self.path, sg.file_offset)
        self.stats["write_bytes"] += sg.nbytes
        self._park(sg)

    def _park(self, sg) -> None:
        """State entries of a written sub-group become storage-less placeholders."""
        for p in sg.params:
            if p in self.swapped:
                st = self.state[p]
                for name, dt in self.spec:
                    st[name] = torch.empty(st[name].shape, dtype=dt, device="meta")

    def _wait(self) -> None:
        t = time.perf_counter()
        self.io.wait()
        self.stats["io_wait_seconds"] += time.perf_counter() - t

    def _step_one(self, i: int) -> None:
        """The inner optimizer's step on sub-group ``i`` only (the others' grads hidden)."""
        mine = set(self.subgroups[i].params)
        hidden = []
        for g in self.param_groups:
            for p in g["params"]:
                if p not in mine and p.grad is not None:
                    hidden.append((p, p.grad))
                    p.grad = None
        try:
            self.inner.step()
        finally:
            for p, grad in hidden:
                p.grad = grad

    # -- the step ---------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        n = len(self.subgroups)
        nslots = lambda: max(1, len(self.buffers))
        self._read(0, 0, sync=True, params=True)
        for i in range(n):
            slot = i % nslots()
            if i >= 1 and nslots() > 1:
                # overlaps this sub-group's step
                self._write(i - 1, (i - 1) % nslots(), params=True)
            prefetched = False
            if i + 1 < n and nslots() >= 2:
                if nslots() == 2:  # the next one goes where the previous one is being written
                    self._wait()
                self._read(i + 1, (i + 1) % nslots(), params=True)
                prefetched = True
            self._step_one(i)
            self._adopt(i, slot)
            self._wait()
            if nslots() == 1:  # one buffer: write, then read, nothing overlaps
                self._write(i, 0, sync=True, params=True)
                if i + 1 < n:
                    self._read(i + 1, 0, sync=True, params=True)
            elif i + 1 < n and not prefetched:  # the buffers were made during this step
                self._read(i + 1, (i + 1) % nslots(), sync=True, params=True)
        if nslots() > 1:
            self._write(n - 1, (n - 1) % nslots(), sync=True, params=True)
        self.stats["step_seconds"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        return loss

    # -- checkpoints and accounting ---------------------------------------------------------------
    @contextlib.contextmanager
    def swapped_in(self):
        """Every swapped state as an ordinary tensor (copies) for as long as the block runs; the
        file stays as it is. For checkpoint writers that read ``optimizer.state`` directly."""
        for i, sg in enumerate(self.subgroups):
            if not any(p in self.swapped for p in sg.params):
                continue
            self._read(i, 0, sync=True)
            for p in sg.params:
                if p in self.swapped:
                    for name, _ in self.spec:
                        self.state[p][name] = self.state[p][name].clone()
        try:
            yield self
        finally:
            for sg in self.subgroups:
                self._park(sg)

    def absorb(self) -> None:
        """After a checkpoint load put ordinary tensors in ``state``: write them to the file."""
        self._int_steps()
        for i, sg in enumerate(self.subgroups):
            fresh = [p for p in sg.params if self.state.get(p) and any(
                _per_element(v, p) for v in self.state[p].values())]
            if not fresh:
                continue
            if self.spec is None:
                self._learn_spec(fresh[0])
            for p in fresh:
                self.swapped.discard(p)
            self._read(i, 0, sync=True)  # the parts of the range that were not reloaded
            self._adopt(i, 0)
            self._write(i, 0, sync=True)

    def _int_steps(self) -> None:
        """The compiled CPU optimizers count steps in a Python int; a loader that does not see
        through this wrapper may hand the count back as a 0-dim tensor (torch's form)."""
        from dslaunch.engine.optim.cpu_adam import CPUOptimizer

        if not isinstance(self.inner, CPUOptimizer):
            return
        for st in self.state.values():
            v = st.get("step")
            if torch.is_tensor(v) and v.dim() == 0:
                st["step"] = int(v)

    def state_dict(self):
        with self.swapped_in():
            sd = self.inner.state_dict()
            sd["state"] = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
                           for k, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)
        self.state = self.inner.state  # torch's loader makes a new dict
        self.swapped.clear()
        self.absorb()

    def buffer_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers + self.master_buffers)

    def swap_stats(self) -> dict:
        """Where the states are and what moved: bytes of buffers and file, I/O totals."""
        return {"path": self.path, "buffers": len(self.buffers),
                "buffer_bytes": self.buffer_bytes(),
                "file_bytes": getattr(self, "file_bytes", 0), "subgroups": len(self.subgroups),
                "master_file_bytes": self.master_file_bytes,
                "master_buffer_bytes": sum(b.numel() for b in self.master_buffers),
                "backend": self.io.backend, "io_mode": self.io.io_mode(self.swap_dir),
                **self.stats}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.io.wait()
        remove_swap_dir(self.swap_dir)


def _name(item) -> str:
    return item[0]


def _per_element(v, p) -> bool:
    return torch.is_tensor(v) and v.dim() > 0 and v.numel() == p.numel() and v.is_floating_point()


def _split(params: list, sub_group_size: int) -> list:
    groups, cur, n = [], [], 0
    for p in params:
        if cur and n + p.numel() > sub_group_size:
            groups.append(_SubGroup(cur))
            cur, n = [], 0
        cur.append(p)
        n += p.numel()
    if cur:
        groups.append(_SubGroup(cur))
    return groups
