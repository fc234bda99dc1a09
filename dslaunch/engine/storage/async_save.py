"""``save_checkpoint(..., async_save=True)``: training goes on while the files are written.

Design (no collective ever runs off the main thread, so it is sound on gloo and NCCL alike):

1. Main thread, collectively (every rank is inside ``save_checkpoint``): rank 0 makes the save's
   ``.<tag>.tmp`` directory, barrier, stage 3 gathers the weights; every tensor of what this rank
   writes is copied to host memory (``snapshot``), so later steps cannot change it.
2. A background thread per rank writes its files (each fsynced, renamed into place) and then a
   marker ``.done.rank_{r}`` (``.failed.rank_{r}`` with the error when it cannot).
3. Rank 0's thread waits, on the shared checkpoint directory, for every rank's marker, then
   publishes exactly as a synchronous save does: ``metadata.json``, the directory renamed to
   ``<tag>``, ``latest`` rewritten last, old tags pruned (``keep_last``). ``latest`` therefore
   moves as soon as every rank's files are complete, not at the next save.
4. ``wait()`` (``engine.wait_checkpoint()``, the start of the next save or load): joins this
   rank's thread, then one all_reduce on the main thread (any rank's failure), so that on
   return every rank knows the save is published, or every rank raises. At interpreter exit
   each rank joins its thread (no collective: other ranks may be gone); rank 0 gives up waiting for markers after
   ``DSLAUNCH_CKPT_COMMIT_TIMEOUT`` seconds (default 600) and leaves ``latest`` as it was.

A rank killed while writing never writes its marker, so ``latest`` is not moved; the half
written ``.tmp`` directory is removed by the next save of that tag. Like the synchronous save,
this assumes one filesystem shared by all ranks (as DeepSpeed does).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref

import torch
import torch.distributed

from dslaunch.engine.storage.files import CheckpointError, atomic_torch_save, crash_point

DONE, FAILED = ".done.rank_{}", ".failed.rank_{}"
TIMEOUT_ENV = "DSLAUNCH_CKPT_COMMIT_TIMEOUT"
WRITER_NICE = 10  # background writers run niced: pickling and page-cache copies cost CPU
DELAY_ENV = "DSLAUNCH_TEST_ASYNC_WRITE_DELAY"  # tests: the writer starts late (steps run first)


class Staging:
    """Host buffers kept from one async save to the next, handed out in the same order each
    save. Why: copying into freshly allocated memory runs at the speed of page faults (measured
    here about 0.6 GB/s), into memory touched before at memcpy speed. Costs one host copy of
    what the rank writes, for the life of the job. A buffer is reused only once the save that
    wrote it is complete (a save waits for the previous one first)."""

    MIN = 1 << 16  # elements: smaller tensors are simply cloned

    def __init__(self):
        self._bufs: list = []
        self._next = 0

    def begin(self) -> None:
        self._next = 0

    def alloc(self, numel: int, dtype) -> torch.Tensor:
        i, self._next = self._next, self._next + 1
        if i < len(self._bufs) and self._bufs[i].numel() == numel and self._bufs[i].dtype == dtype:
            return self._bufs[i]
        buf = torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())
        self._bufs[i:i + 1] = [buf]
        return buf

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.numel() < self.MIN:
            return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
        return self.alloc(t.numel(), t.dtype).view(t.shape).copy_(t)


def snapshot(obj, live: set, staging: Staging):
    """A copy of ``obj`` that shares no memory with the training state (which the next steps
    change in place): a tensor whose storage is in ``live`` (``live_storages``) or not on the
    host is copied into host memory; the others were made for this save (a ZeRO shard is
    gathered into new tensors) and are kept as they are, so nothing is copied twice."""
    if torch.is_tensor(obj):
        t = obj.detach()
        if t.device.type != "cpu" or t.untyped_storage().data_ptr() in live:
            return staging.copy(t)
        return t
    if isinstance(obj, dict):
        return {k: snapshot(v, live, staging) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v, live, staging) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(snapshot(v, live, staging) for v in obj)
    return obj


def live_storages(*roots, depth: int = 8) -> set:
    """The storage addresses of every tensor reachable from ``roots`` (the module, the
    optimizer, the ZeRO strategy): modules by their state, optimizers by their state and
    groups, containers, and dslaunch's own objects by their attributes."""
    seen, ptrs = set(), set()

    def visit(obj, d):
        if d > depth or id(obj) in seen:
            return
        seen.add(id(obj))
        if torch.is_tensor(obj):
            ptrs.add(obj.untyped_storage().data_ptr())
            if obj.is_leaf and obj.grad is not None:
                ptrs.add(obj.grad.untyped_storage().data_ptr())
            return
        if isinstance(obj, torch.nn.Module):
            items = list(obj.state_dict(keep_vars=True).values())
        elif isinstance(obj, torch.optim.Optimizer):
            items = [obj.state, obj.param_groups, getattr(obj, "inner", None)]
        elif isinstance(obj, dict):
            items = [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
        elif type(obj).__module__.startswith("dslaunch") and hasattr(obj, "__dict__"):
            items = list(vars(obj).values())
        else:
            return
        for x in items:
            visit(x, d + 1)

    for root in roots:
        visit(root, 0)
    return ptrs


def write_files(files: dict, rank: int) -> None:
    """Each ``{path: object}`` written atomically (fsynced, renamed)."""
    for path, obj in files.items():
        atomic_torch_save(obj, path)
    crash_point("after_files", rank)


class AsyncSaver:
    """One rank's background checkpoint writer (at most one save in flight)."""

    def __init__(self, comm, rank: int, world: int, device):
        self.comm, self.rank, self.world, self.device = comm, rank, world, device
        self.staging = Staging()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._step = None
        self._on_done = None
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s.join())

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def start(self, files: dict, tmp: str, publish, step: int, on_done) -> None:
        """Write ``files`` (already snapshotted) into ``tmp`` in the background; rank 0 then
        calls ``publish()`` once every rank's files are complete."""
        self._error, self._step, self._on_done = None, step, on_done
        self._thread = threading.Thread(target=self._run, args=(files, tmp, publish),
                                        name="dslaunch-ckpt-writer", daemon=True)
        self._thread.start()

    def _run(self, files, tmp, publish) -> None:
        try:  # the writer yields the CPU to training where both want it (Linux: per thread)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        except (AttributeError, OSError):
            pass
        try:
            time.sleep(float(os.environ.get(DELAY_ENV, "0")))
            try:
                write_files(files, self.rank)
            except BaseException as e:
                _marker(os.path.join(tmp, FAILED.format(self.rank)), f"{type(e).__name__}: {e}")
                raise
            del files  # the host copies are not needed any more
            _marker(os.path.join(tmp, DONE.format(self.rank)), "")
            if self.rank == 0:
                self._await_ranks(tmp)
                publish()
        except BaseException as e:  # raised on the main thread by wait()
            self._error = e

    def _await_ranks(self, tmp: str) -> None:
        deadline = time.monotonic() + float(os.environ.get(TIMEOUT_ENV, "600"))
        missing = set(range(self.world))
        delay = 0.005
        while missing:
            for r in sorted(missing):
                failed = os.path.join(tmp, FAILED.format(r))
                if os.path.exists(failed):
                    with open(failed) as f:
                        raise CheckpointError(f"{tmp}: rank {r} could not write its checkpoint "
                                              f"files ({f.read().strip()}); 'latest' unchanged")
                if os.path.exists(os.path.join(tmp, DONE.format(r))):
                    missing.discard(r)
            if not missing:
                break
            if time.monotonic() > deadline:
                raise CheckpointError(f"{tmp}: ranks {sorted(missing)} did not finish writing "
                                      f"within {TIMEOUT_ENV}; 'latest' unchanged")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        for r in range(self.world):
            os.remove(os.path.join(tmp, DONE.format(r)))

    def poll(self) -> None:
        """Cheap, main thread: a write that finished is recorded (``on_done``) now."""
        if self._thread is not None and not self._thread.is_alive() and self._error is None:
            self._thread.join()
            if self._on_done is not None:
                self._on_done(self._step)
            self._on_done = None

    def join(self) -> None:
        """This rank's writes (and on rank 0 the publish) finished; no collective."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join()
        if self._error is None and self._on_done is not None:
            self._on_done(self._step)
        self._on_done = None

    def wait(self) -> None:
        """Collective: every rank's save in flight is complete and published (or its error is
        raised here, on every rank that saw one)."""
        if self._thread is None:
            return
        self.join()
        error, self._error = self._error, None
        # one collective instead of a barrier: every rank learns whether any rank failed
        failed = torch.tensor([0 if error is None else 1 + self.rank], dtype=torch.int64,
                              device=self.device)
        self.comm.all_reduce(failed, op=torch.distributed.ReduceOp.MAX)
        if error is not None:
            raise error if isinstance(error, CheckpointError) else CheckpointError(
                f"asynchronous checkpoint save failed ({type(error).__name__}: {error})")
        if int(failed):
            raise CheckpointError(f"asynchronous checkpoint save failed on rank "
                                  f"{int(failed) - 1} (its error is in its log); 'latest' "
                                  "unchanged")


def _marker(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
