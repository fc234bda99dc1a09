"""The CPU as an accelerator: every rank computes on the host, collectives go over gloo.

Answers that are not obvious:

- ``current_device()`` is ``"cpu"`` (what ``torch.cpu.current_device()`` answers), not an index:
  ``torch.zeros(n, device=acc.current_device())`` must not land on ``cuda:0``. ``device_name(i)``
  is ``"cpu"`` for every ``i``.
- ``device_count()`` is ``LOCAL_WORLD_SIZE`` (1 outside a launcher): each rank on a host counts as
  owning one CPU "device", so ``local_rank % device_count()``, ``local_rank < device_count()`` and
  ``world_size // device_count()`` (the number of hosts) mean what they mean on GPUs.
  ``set_device`` is a no-op.
- Memory figures are the process's own, from the OS (see :class:`ProcessMemory`): the resident
  set size (RSS) now and its peak since the last reset. The CPU has no caching allocator whose
  "allocated" could be told apart from "reserved", so both report RSS, which counts everything
  the process keeps in RAM (tensors, the interpreter, libraries, memory malloc has kept after a
  ``free``), not only tensors. ``empty_cache()`` asks glibc to give freed heap memory back
  (``malloc_trim``), the nearest thing to emptying a cache.
- Streams and events are :class:`NullStream` / :class:`NullEvent`: CPU work is done when the call
  returns, so every wait is satisfied; ``elapsed_time`` raises (use host timers).
- ``pin_memory(t)`` returns ``t`` itself (no copy) and ``is_pinned`` is True for any CPU tensor:
  the host memory is the device memory, so there is nothing to pin and nothing to wait for.
- bf16 and fp16 are supported (torch computes both on the CPU, and the engine trains in both
  here); Triton is not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys
import threading

import psutil
import torch

from dslaunch.accelerator.abstract import Accelerator, NullEvent, NullStream, null_context


class ProcessMemory:
    """The resident set size (RSS) of this process now, and its peak since the last reset.

    How the peak is known: on Linux the kernel keeps the process's RSS high-water mark
    (``VmHWM`` in ``/proc/self/status``), updated at every page fault, so a peak between two of
    our calls is never missed (a sampled maximum would miss a tensor allocated and freed between
    samples). Resetting writes ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), which sets the
    mark back to the current RSS. ``getrusage``'s ``ru_maxrss`` is the same mark but cannot be
    reset, so it alone cannot answer "peak since reset".

    Limits: the figure is per process, for all its threads; it counts every resident page (see
    the module docstring), and pages swapped out are not resident. Where ``/proc`` is missing or
    ``clear_refs`` cannot be written (another OS, a locked-down container), the peak falls back
    to the largest RSS seen by any call of this class since the reset, raised to ``ru_maxrss``
    once that grows past its value at the reset (a new lifetime peak happened after it); a
    short-lived peak between calls that stays below the lifetime peak is then missed.
    """

    _STATUS = "/proc/self/status"
    _CLEAR_REFS = "/proc/self/clear_refs"

    def __init__(self):
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._process = psutil.Process()
        self._sampled_peak = 0
        self._rusage_at_reset = None  # ru_maxrss when last reset; None: never reset
        self._kernel_peak = self._read_hwm() is not None  # False: the fallback above

    def current(self) -> int:
        if os.getpid() != self._pid:  # a forked child: its own process, its own figures
            self._start()
        rss = self._process.memory_info().rss
        with self._lock:
            self._sampled_peak = max(self._sampled_peak, rss)
        return rss

    def peak(self) -> int:
        now = self.current()
        if self._kernel_peak:
            hwm = self._read_hwm()
            if hwm is not None:
                return max(hwm, now)
        peak = self._sampled_peak
        maxrss = self._ru_maxrss()
        if self._rusage_at_reset is None or maxrss > self._rusage_at_reset:
            peak = max(peak, maxrss)
        return max(peak, now)

    def reset(self) -> None:
        try:
            with open(self._CLEAR_REFS, "w") as f:
                f.write("5")
            self._kernel_peak = self._read_hwm() is not None
        except OSError:
            self._kernel_peak = False
        with self._lock:
            self._rusage_at_reset = self._ru_maxrss()
            self._sampled_peak = 0
        self.current()

    @classmethod
    def _read_hwm(cls):
        try:
            with open(cls._STATUS) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
        except (OSError, ValueError, IndexError):
            pass
        return None

    @staticmethod
    def _ru_maxrss() -> int:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, else kB


_MEMORY = None  # one per process: the kernel's mark (and its reset) is process-wide
_MEMORY_LOCK = threading.Lock()


def process_memory() -> ProcessMemory:
    global _MEMORY
    with _MEMORY_LOCK:
        if _MEMORY is None:
            _MEMORY = ProcessMemory()
        return _MEMORY


@functools.cache
def _malloc_trim_function():
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def _malloc_trim() -> bool:
    """Return freed heap memory to the OS (glibc); False where there is no malloc_trim."""
    trim = _malloc_trim_function()
    if trim is None:
        return False
    trim(0)
    return True


_STREAM = NullStream("cpu")


class CPUAccelerator(Accelerator):
    _name = "cpu"
    _communication_backend_name = "gloo"
    _op_kinds = ("cpu",)

    def __init__(self):
        self._memory = process_memory()

    # -- the device
    def device_name(self, device_index=None) -> str:
        return "cpu"

    def current_device(self):
        return "cpu"

    def current_device_name(self) -> str:
        return "cpu"

    def set_device(self, device_index) -> None:
        pass

    def device_count(self) -> int:
        try:
            return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            return 1

    def is_available(self) -> bool:
        return True

    def device(self, device_index=None):
        return null_context()

    def synchronize(self, device_index=None) -> None:
        pass

    def is_synchronized_device(self) -> bool:
        return True

    # -- random numbers
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def seed(self) -> None:
        torch.seed()

    def get_rng_state(self, device_index=None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None) -> None:
        torch.set_rng_state(new_state)

    def default_generator(self, device_index=None) -> torch.Generator:
        return torch.default_generator

    # -- streams and events
    @property
    def Stream(self):
        return NullStream

    @property
    def Event(self):
        return NullEvent

    def stream(self, stream):
        return null_context(stream)

    def current_stream(self, device_index=None):
        return _STREAM

    def default_stream(self, device_index=None):
        return _STREAM

    # -- memory
    def memory_allocated(self, device_index=None) -> int:
        return self._memory.current()

    def max_memory_allocated(self, device_index=None) -> int:
        return self._memory.peak()

    def reset_peak_memory_stats(self, device_index=None) -> None:
        self._memory.reset()

    def memory_reserved(self, device_index=None) -> int:
        return self._memory.current()

    def max_memory_reserved(self, device_index=None) -> int:
        return self._memory.peak()

    def total_memory(self, device_index=None) -> int:
        return psutil.virtual_memory().total  # the host's RAM; a cgroup limit is not applied

    def available_memory(self, device_index=None) -> int:
        return psutil.virtual_memory().available

    def empty_cache(self) -> None:
        _malloc_trim()

    def memory_stats(self, device_index=None) -> dict:
        now, peak = self._memory.current(), self._memory.peak()
        return {"allocated_bytes.all.current": now, "allocated_bytes.all.peak": peak,
                "reserved_bytes.all.current": now, "reserved_bytes.all.peak": peak}

    # -- dtypes
    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    def is_triton_supported(self) -> bool:
        return False

    def amp(self):
        return torch.cpu.amp

    # -- tensors
    def pin_memory(self, tensor, align_bytes: int = 1):
        return tensor

    def is_pinned(self, tensor) -> bool:
        return tensor.device.type == "cpu"

    # -- environment
    def export_envs(self) -> list[str]:
        return ["GLOO", "OMP", "KMP", "MKL"]

    def visible_devices_envs(self) -> list[str]:
        return []
