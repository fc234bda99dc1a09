"""ZeRO-Infinity optimizer offload to NVMe: optimizer states and fp32 masters live in files.

With ``offload_optimizer: {device: nvme, nvme_path: DIR}`` a ZeRO 1-3 strategy runs exactly as
with ``device: cpu`` (fp32 gradient shard on the CPU, the step there, with the compiled CPU Adam
when it applies), but the optimizer's per-element states (Adam's exp_avg and exp_avg_sq, ...) and
its parameters, the fp32 master shard, are kept in swap files per rank under
``DIR/dslaunch-<host>-<pid>/rank<r>/`` (``optimizer_states.swp``, ``fp32_master.swp``). Between
steps the state entries of the optimizer are ``meta`` tensors and its parameters (views of the
strategy's ``g.master``, also storage-less then) CPU tensors without storage: the CPU holds only
the swap buffers.

The step walks the shard parameters in sub-groups of about ``sub_group_size`` elements. Sub-group
``i``'s states (and masters, in a second set of buffers) are in buffer ``i % buffer_count``;
while it is stepped, the next sub-group is read
(async pread) into its buffer and the previous one written back (async pwrite), through one
``AsyncIOHandle`` built from the config's ``aio`` section. Each sub-group is one contiguous,
4 KiB-aligned range of the file, so each transfer is one large request (O_DIRECT where the file
system accepts it). The first step lets the optimizer create its states sub-group by sub-group
(so even then no more than one sub-group's states exist in plain memory) and learns from them
what to swap: every state tensor with as many elements as its parameter.

CPU memory for the states is ``buffer_count`` x (the largest sub-group's states), about
``buffer_count * sub_group_size * 8`` bytes for fp32 Adam, plus
``buffer_count * sub_group_size * 4``
for the masters (a sub-group holds whole shard chunks,
so it can exceed ``sub_group_size`` by up to one chunk); buffers are page-aligned and mlock'ed
where RLIMIT_MEMLOCK allows (``pin_memory``; CUDA-pinned when CUDA is there). With one buffer
nothing overlaps; with two the prefetch waits for the previous write-back. DeepSpeed's
``pipeline_read``/``pipeline_write``/``fast_init``/``ratio`` are accepted and not used: reads and
writes always overlap the step when there are two buffers or more, and all states are swapped.

The masters are written to their file when the strategy is built. After the step the strategy
needs the new values (stages 1-2 all-gather them, stage 3 writes its parameter shard): it reads
them back sub-group by sub-group (``iter_params``; one more read of the master file per step, no
more memory than the buffers). Everything else that reads or writes the masters (checkpoint save
and load, ``load_resharded``, ``sync_from_model``, stage 3's ``release_params`` with a
``modifier_rank``) runs inside the strategy's ``masters_in(write=...)``: ``g.master`` is
allocated and filled from the file for the block (as much memory as CPU offload, for that
long) and written back after it. Checkpoints are those of CPU offload: saving reads the states
back into ordinary tensors for the shard writer; loading writes the loaded states to the file.
The swap directory is removed
at exit, on SIGTERM (when no one else handles it) and, for a rank that was SIGKILLed, by the next
job that uses the same ``nvme_path`` (a live job holds an flock in its directory).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import tempfile
import time
import weakref

import torch


KEY = "zero_optimization.offload_optimizer"
ALIGN = 4096
SWAP_PREFIX = "dslaunch-"


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# -- the swap directory -----------------------------------------------------------------------------

def _try_lock(path: str):
    """An fd holding an exclusive flock on ``path``, or None when someone holds it."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_stale(nvme_path: str) -> None:
    """Remove swap directories whose process is gone (a SIGKILLed rank cannot clean up after
    itself). A live process holds an flock on ``<dir>/.lock`` and the kernel drops it when the
    process dies, however it dies; so a directory whose lock can be taken is stale, whichever host
    or pid namespace it came from. A directory without a lock file is left alone."""
    try:
        names = os.listdir(nvme_path)
    except OSError:
        return
    for name in names:
        job_dir = os.path.join(nvme_path, name)
        if not name.startswith(SWAP_PREFIX):
            continue
        fd = _try_lock(os.path.join(job_dir, ".lock"))
        if fd is None:
            continue
        try:
            shutil.rmtree(job_dir, ignore_errors=True)
        finally:
            os.close(fd)


_JOB_DIRS: dict = {}  # nvme_path -> [job directory, lock fd] of this process


def _job_dir(path: str) -> str:
    """This process's directory under ``path``, locked for as long as the process lives. It is
    made under a hidden name and renamed once locked, so a scan never sees it unlocked."""
    if path in _JOB_DIRS:
        return _JOB_DIRS[path][0]
    tmp = tempfile.mkdtemp(prefix=".dslaunch-new-", dir=path)
    fd = os.open(os.path.join(tmp, ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    host = socket.gethostname().replace("/", "_")
    final = os.path.join(path, f"{SWAP_PREFIX}{host}-{os.getpid()}")
    for k in range(1000):  # a name left by an earlier process with our pid is still locked
        try:
            os.rename(tmp, final if k == 0 else f"{final}.{k}")
            final = final if k == 0 else f"{final}.{k}"
            break
        except OSError:
            continue
    _JOB_DIRS[path] = [final, fd]
    return final


def make_swap_dir(nvme_path, rank: int, key: str = KEY) -> str:
    """Create ``nvme_path/dslaunch-<host>-<pid>/rank<rank>`` (``rank<rank>.<k>`` for a second
    optimizer of the same rank in one process); a clear error naming ``key`` when nvme_path is
    missing, not a directory or not writable."""
    if not nvme_path:
        raise ValueError(f"{key}.nvme_path: missing; device is nvme, so put the directory on the "
                         "NVMe drive here")
    path = os.path.abspath(os.path.expanduser(str(nvme_path)))
    if not os.path.exists(path):
        raise ValueError(f"{key}.nvme_path: {path} does not exist on host {socket.gethostname()}; "
                         "create it (a directory on the NVMe drive) or fix the path")
    if not os.path.isdir(path):
        raise ValueError(f"{key}.nvme_path: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{key}.nvme_path: {path} is not writable by this user; pick a "
                         "directory you can write to")
    try:
        _remove_stale(path)
        job_dir = _job_dir(path)
        for k in range(1000):
            rank_dir = os.path.join(job_dir, f"rank{rank}" + (f".{k}" if k else ""))
            try:
                os.mkdir(rank_dir)
                _register_cleanup(rank_dir)
                return rank_dir
            except FileExistsError:
                continue
        raise OSError(17, "too many swap directories for one rank")
    except OSError as exc:
        raise ValueError(f"{key}.nvme_path: cannot create a swap directory in {path}: "
                         f"{exc.strerror or exc}") from None


_LIVE_DIRS: set = set()
_SIGTERM_INSTALLED = False


def _cleanup_all() -> None:
    for d in list(_LIVE_DIRS):
        _remove_dir(d)


def _remove_dir(rank_dir: str) -> None:
    _LIVE_DIRS.discard(rank_dir)
    shutil.rmtree(rank_dir, ignore_errors=True)
    job_dir = os.path.dirname(rank_dir)
    for path, (jd, fd) in list(_JOB_DIRS.items()):
        if jd != job_dir:
            continue
        with contextlib.suppress(OSError):  # the job directory, once its last rank is gone
            if os.listdir(jd) == [".lock"]:
                os.unlink(os.path.join(jd, ".lock"))
                os.rmdir(jd)
                os.close(fd)
                del _JOB_DIRS[path]


def _on_sigterm(signum, frame):
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as the launcher expects


def _register_cleanup(rank_dir: str) -> None:
    """Remove the directory at exit, and on SIGTERM when nobody else handles that signal."""
    global _SIGTERM_INSTALLED
    _LIVE_DIRS.add(rank_dir)
    if not _SIGTERM_INSTALLED:
        atexit.register(_cleanup_all)
        with contextlib.suppress(ValueError):  # not the main thread: atexit only
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        _SIGTERM_INSTALLED = True


# -- the optimizer wrapper ----------------------------------------------------------------------------

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


class NVMeSwappedOptimizer(torch.optim.Optimizer):
    """Steps ``inner`` (an optimizer over CPU shard parameters) sub-group by sub-group with its
    per-element states swapped between a file in ``swap_dir`` and ``buffer_count`` CPU buffers.

    ``param_groups`` and ``state`` are the inner optimizer's own objects, so LR schedules and the
    shard checkpoint code see them; swapped-out state entries are ``meta`` tensors."""

    def __init__(self, inner, swap_dir: str, sub_group_size: int = int(1e9), buffer_count: int = 4,
                 aio: dict | None = None, key: str = KEY, swap_params: bool = False):
        from dslaunch.nvme.aio import AioUnavailable, AsyncIOHandle

        for group in inner.param_groups:
            for p in group["params"]:
                if p.device.type != "cpu":
                    raise ValueError(f"{key}.device: nvme offload steps CPU shards, but a "
                                     f"parameter is on {p.device}")
        self.inner = inner
        self.key = key
        self.swap_dir = swap_dir
        self.path = os.path.join(swap_dir, "optimizer_states.swp")
        aio = {k: v for k, v in (aio or {}).items() if k in (
            "block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")}
        try:
            self.io = AsyncIOHandle(**aio)
        except AioUnavailable as exc:
            raise RuntimeError(f"{key}.device: nvme offload needs the async_io op: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"aio: {exc}") from None
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
        weakref.finalize(self, _remove_dir, swap_dir)
        self.swap_params = bool(swap_params)
        self.master_path = os.path.join(swap_dir, "fp32_master.swp")
        self.master_buffers: list = []
        self.master_file_bytes = 0
        self.stats.update(master_read_bytes=0, master_write_bytes=0)
        if self.swap_params:
            self._adopt_params()

    # -- the parameters themselves (the fp32 master shard) ------------------------------------
    def _adopt_params(self) -> None:
        """Write the parameters' values to their own file and leave them storage-less."""
        plan, self.master_file_bytes, self.master_buffers = self._lay_out_file(
            lambda p: _round_up(p.numel() * p.element_size()), self.master_path)
        for sg, (start, offsets, nbytes) in zip(self.subgroups, plan):
            sg.m_offset, sg.m_nbytes = start, nbytes
            sg.m_offsets.update(offsets)
        self.store_params()
        self.park_params()

    def _mview(self, sg, slot: int, p):
        at = sg.m_offsets[p]
        return self.master_buffers[slot][at: at + p.numel() * p.element_size()].view(
            p.dtype).view(p.shape)

    def _read_params(self, i: int, slot: int, sync: bool = False) -> None:
        """Point sub-group ``i``'s parameters at buffer ``slot`` and read their values into it."""
        sg = self.subgroups[i]
        for p in sg.params:
            p.data = self._mview(sg, slot, p)
        (self.io.sync_pread if sync else self.io.async_pread)(
            self.master_buffers[slot][: sg.m_nbytes], self.master_path, sg.m_offset)
        self.stats["master_read_bytes"] += sg.m_nbytes

    def _write_params(self, i: int, slot: int, sync: bool = False) -> None:
        sg = self.subgroups[i]
        (self.io.sync_pwrite if sync else self.io.async_pwrite)(
            self.master_buffers[slot][: sg.m_nbytes], self.master_path, sg.m_offset)
        self.stats["master_write_bytes"] += sg.m_nbytes
        for p in sg.params:
            p.data = _placeholder(p)

    def load_params(self) -> None:
        """Read every parameter's values from the file into the memory its ``.data`` is now
        (the caller gave each parameter ordinary storage first)."""
        for i, sg in enumerate(self.subgroups):
            self.io.sync_pread(self.master_buffers[0][: sg.m_nbytes], self.master_path,
                               sg.m_offset)
            self.stats["master_read_bytes"] += sg.m_nbytes
            for p in sg.params:
                p.data.copy_(self._mview(sg, 0, p))

    def store_params(self) -> None:
        """Write every parameter's current values (ordinary storage) to the file."""
        for sg in self.subgroups:
            for p in sg.params:
                self._mview(sg, 0, p).copy_(p.data)
            self.io.sync_pwrite(self.master_buffers[0][: sg.m_nbytes], self.master_path,
                                sg.m_offset)
            self.stats["master_write_bytes"] += sg.m_nbytes

    def park_params(self) -> None:
        """Every parameter storage-less (its values are in the file)."""
        for sg in self.subgroups:
            for p in sg.params:
                p.data = _placeholder(p)

    def iter_params(self):
        """Each parameter in order, with its values readable (a view of a swap buffer) while
        the caller holds it; the next sub-group is read ahead. Read-only."""
        n, slots = len(self.subgroups), len(self.master_buffers)
        self._read_params(0, 0, sync=True)
        try:
            for i, sg in enumerate(self.subgroups):
                if i + 1 < n and slots > 1:
                    self._read_params(i + 1, (i + 1) % slots)
                for p in sg.params:
                    yield p
                if i + 1 < n and slots > 1:
                    self._wait()
                for p in sg.params:
                    p.data = _placeholder(p)
                if i + 1 < n and slots == 1:
                    self._read_params(i + 1, 0, sync=True)
        finally:
            self._wait()
            self.park_params()

    # -- layout ---------------------------------------------------------------------------------
    def _learn_spec(self, p) -> None:
        st = self.inner.state.get(p) or {}
        spec = [(k, v.dtype) for k, v in st.items() if _per_element(v, p)]
        if self.spec is None:
            self.spec = spec
            self._build_layout()
        elif sorted(spec, key=_name) != sorted(self.spec, key=_name):
            raise RuntimeError(f"{self.key}.device: nvme offload needs the same per-element states "
                               f"for every parameter; got {[k for k, _ in spec]} after "
                               f"{[k for k, _ in self.spec]}")

    def _param_bytes(self, p) -> list:
        return [_round_up(p.numel() * torch.empty((), dtype=dt).element_size())
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
        nslots = lambda: max(1, len(self.buffers))  # noqa: E731 - known after the first step
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
        from dslaunch.engine.optim.cpu_adam import _CPUOptimizer

        if not isinstance(self.inner, _CPUOptimizer):
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
        return {"path": self.path, "buffers": len(self.buffers), "buffer_bytes": self.buffer_bytes(),
                "file_bytes": getattr(self, "file_bytes", 0), "subgroups": len(self.subgroups),
                "master_file_bytes": self.master_file_bytes,
                "master_buffer_bytes": sum(b.numel() for b in self.master_buffers),
                "backend": self.io.backend, "io_mode": self.io.io_mode(self.swap_dir),
                **self.stats}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.io.wait()
        _remove_dir(self.swap_dir)


def _placeholder(p) -> torch.Tensor:
    """A CPU tensor shaped like ``p`` with no storage: the parameter keeps its device, dtype and
    shape (gradients can be assigned to it) while its values are in the file."""
    t = torch.empty(p.shape, dtype=p.dtype)
    t.untyped_storage().resize_(0)
    return t


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


# -- the strategy side --------------------------------------------------------------------------------

def aio_settings(aio) -> dict:
    """The config's typed ``aio`` section as AsyncIOHandle arguments."""
    return {k: getattr(aio, k) for k in AIO_KEYS}


AIO_KEYS = ("block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")


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
                    g.master = _placeholder(g.master)

        @contextlib.contextmanager
        def masters_in(self, write: bool = False):
            """The fp32 master shard in memory (``g.master``, the optimizer's parameters views of
            it, as with CPU offload) while the block runs; ``write``: back to the file after it.
            Every reader or writer of the masters outside the step goes through this."""
            if self.masters_resident:
                yield self
                return
            from dslaunch.engine.zero import partition as P

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
                    g.master = _placeholder(g.master)

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
