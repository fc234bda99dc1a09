"""The ``nvme-tune`` sweep: time the async I/O op over a grid of settings on files in one or more
directories and pick the best ``aio`` config section (DeepSpeed's ``ds_nvme_tune``).

Each trial builds an :class:`~dslaunch.nvme.aio.AsyncIOHandle` with one setting and moves
``io_size`` bytes (split evenly over the directories, one async op per directory, all in flight
together) from a page-aligned buffer to a file (write) or back (read); bandwidth = bytes / wall
time of submit..wait, the median over ``loops`` repeats. The files live in a private temporary
directory inside each target directory, removed at the end whatever happens (the caller turns
SIGTERM into an exception so ``finally`` runs).
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dslaunch.nvme.aio import ALIGN, DEFAULTS

WORKDIR_PREFIX = ".dslaunch-nvme-tune."
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
KEYS = ("block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events")
ALIASES = {"io_parallel": "intra_op_parallelism", "thread_count": "intra_op_parallelism",
           "num_threads": "intra_op_parallelism"}
# DeepSpeed's ds_nvme_tune default grid: 3 x 3 x 4 x 2 x 2 = 144 settings.
DEFAULT_SWEEP = {
    "block_size": [128 << 10, 256 << 10, 1 << 20],
    "queue_depth": [4, 16, 32],
    "intra_op_parallelism": [1, 2, 4, 8],
    "single_submit": [False, True],
    "overlap_events": [True, False],
}
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


class TuneError(ValueError):
    """Bad input for the sweep; the message is one line."""


def parse_size(value) -> int:
    """Bytes from an int or a string like "400M", "1G", "128K", "4096" (binary units)."""
    if isinstance(value, bool):
        raise TuneError(f"{value!r} is not a size")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise TuneError(f"{value!r} is not a size (e.g. 4096, 128K, 400M, 1G)")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise TuneError(f"size must be positive, got {value!r}")
    return n


def human(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


# -------------------------------------------------------------------------------------------------
# sweep grid


def load_sweep(path) -> dict:
    """A sweep from a JSON/YAML file: {key: [values]} over KEYS (and DeepSpeed's io_parallel);
    a key left out keeps the handle default. Raises TuneError naming the bad key."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TuneError(f"--sweep-config {path}: {exc.strerror}") from None
    try:
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TuneError(f"--sweep-config {path}: not valid JSON/YAML: {first}") from None
    if not isinstance(raw, dict):
        raise TuneError(f"--sweep-config {path}: expected an object of lists, e.g. "
                        '{"block_size": ["128K", "1M"], "queue_depth": [8, 32]}')
    return normalize_sweep(raw, where=f"--sweep-config {path}: ")


def normalize_sweep(raw: dict, where: str = "") -> dict:
    sweep = {k: [v] for k, v in DEFAULTS.items()}
    for key, values in raw.items():
        name = ALIASES.get(key, key)
        if name not in KEYS:
            near = difflib.get_close_matches(str(key), [*KEYS, *ALIASES], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(KEYS)})"
            raise TuneError(f"{where}unknown key {key!r}{hint}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise TuneError(f"{where}{key}: empty list")
        sweep[name] = [_check_value(name, v, where) for v in values]
        sweep[name] = list(dict.fromkeys(sweep[name]))  # drop duplicates, keep order
    return sweep


def _check_value(name, v, where):
    if name in ("single_submit", "overlap_events"):
        if not isinstance(v, bool):
            raise TuneError(f"{where}{name}: expected true/false, got {v!r}")
        return v
    if name == "block_size":
        try:
            n = parse_size(v)
        except TuneError as exc:
            raise TuneError(f"{where}block_size: {exc}") from None
        if n % ALIGN:
            raise TuneError(f"{where}block_size: {v!r} is not a multiple of {ALIGN}")
        return n
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TuneError(f"{where}{name}: expected an integer >= 1, got {v!r}")
    return v


def grid(sweep: dict) -> list[dict]:
    return [dict(zip(KEYS, combo)) for combo in itertools.product(*(sweep[k] for k in KEYS))]


# -------------------------------------------------------------------------------------------------
# directories


@dataclass
class Target:
    path: Path
    share: int                 # bytes of each op that go to this directory
    workdir: Path | None = None
    io_mode: str = ""

    @property
    def file(self) -> Path:
        return self.workdir / "data.bin"


def check_dirs(dirs, io_size: int) -> list[Target]:
    """Refuse (TuneError) a directory that does not exist, is not a directory, is not writable,
    or has less free space than its share of io_size. Same directory twice counts once."""
    if not dirs:
        raise TuneError("give at least one --nvme-dir")
    unique = list(dict.fromkeys(Path(d).resolve() for d in dirs))
    per = -(-io_size // len(unique))
    per = -(-per // ALIGN) * ALIGN if per >= ALIGN else per
    targets, left = [], io_size
    for d in unique:
        if not d.exists():
            raise TuneError(f"--nvme-dir {d}: does not exist")
        if not d.is_dir():
            raise TuneError(f"--nvme-dir {d}: not a directory")
        share = min(per, left)
        if share <= 0:
            raise TuneError(f"--io-size {io_size} is too small to split over {len(unique)} directories")
        left -= share
        try:  # os.access lies for root on read-only mounts: really create a file
            fd, probe = tempfile.mkstemp(prefix=WORKDIR_PREFIX + "probe.", dir=d)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise TuneError(f"--nvme-dir {d}: not writable ({exc.strerror})") from None
        free = shutil.disk_usage(d).free
        if free < share:
            raise TuneError(f"--nvme-dir {d}: needs {human(share)} ({share} bytes) for --io-size, "
                            f"has {free} bytes free")
        targets.append(Target(d, share))
    return targets


# -------------------------------------------------------------------------------------------------
# running


@dataclass
class Trial:
    op: str                      # "read" | "write"
    config: dict
    seconds: list[float] = field(default_factory=list)
    nbytes: int = 0

    @property
    def gbps(self) -> float:
        return self.nbytes / statistics.median(self.seconds) / 1e9 if self.seconds else 0.0

    def to_json(self) -> dict:
        return {"op": self.op, **self.config, "gbps": round(self.gbps, 4),
                "seconds": [round(s, 6) for s in self.seconds]}


class Sweep:
    """Owns the temporary files. Use as a context manager: files are removed on exit, whatever
    the exit."""

    def __init__(self, targets: list[Target], io_size: int, configs: list[dict], ops=("write", "read"),
                 loops: int = 1, flush_page_cache: bool = False):
        """``flush_page_cache``: drop the test files' cached pages before each timed read, so a
        buffered (not O_DIRECT) read is not served from memory (DeepSpeed's flag of the name)."""
        self.targets, self.io_size, self.configs, self.ops, self.loops = (
            targets, io_size, configs, tuple(ops), loops)
        self.flush_page_cache = flush_page_cache
        self.trials: list[Trial] = []
        self.backend = self.backend_note = None
        self._buffers = []
        self._alloc = None

    def __enter__(self):
        try:
            for t in self.targets:
                t.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=t.path))
            return self
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc):
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the files. SIGINT/SIGTERM wait until this is done (then act as usual)."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if main else None
        try:
            if self._alloc is not None:
                self._alloc.close()
                self._alloc = None
            self._buffers = []
            for t in self.targets:
                if t.workdir is not None:
                    shutil.rmtree(t.workdir, ignore_errors=True)
                    t.workdir = None
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def total_runs(self) -> int:
        return len(self.configs) * len(self.ops) * self.loops

    def prepare(self) -> None:
        """Page-aligned buffers (one per directory) and the data files, written once so that
        reads have something to read and writes overwrite (not allocate)."""
        import torch

        from dslaunch.nvme.aio import AsyncIOHandle, probe_direct

        self._alloc = AsyncIOHandle(**DEFAULTS)
        self.backend, self.backend_note = self._alloc.backend, self._alloc.backend_note
        g = torch.Generator().manual_seed(0)
        for t in self.targets:
            buf = self._alloc.new_cpu_locked_tensor(t.share, torch.uint8)
            buf.copy_(torch.randint(0, 256, (t.share,), dtype=torch.uint8, generator=g))
            self._buffers.append(buf)
            ok, why = probe_direct(t.workdir)
            t.io_mode = "O_DIRECT" if ok else f"buffered ({why})"
            self._alloc.sync_pwrite(buf, t.file)

    def run(self, on_trial=None):
        """Run every (config, op, loop); on_trial(trial, done, total) after each run."""
        from dslaunch.nvme.aio import AsyncIOHandle

        done = 0
        for cfg in self.configs:
            for op in self.ops:
                trial = Trial(op, cfg, nbytes=self.io_size)
                self.trials.append(trial)
                with AsyncIOHandle(**cfg) as h:
                    for _ in range(self.loops):
                        trial.seconds.append(self._time_once(h, op))
                        done += 1
                        if on_trial:
                            on_trial(trial, done, self.total_runs())
        return self.trials

    def _time_once(self, h, op) -> float:
        submit = h.async_pread if op == "read" else h.async_pwrite
        if op == "read" and self.flush_page_cache:
            self.drop_cached_pages()
        start = time.perf_counter()
        for t, buf in zip(self.targets, self._buffers):
            submit(buf, t.file)
        h.wait()
        return time.perf_counter() - start

    def drop_cached_pages(self) -> None:
        """Write back and evict the test files' pages (posix_fadvise DONTNEED: no root needed,
        unlike dropping the whole page cache)."""
        for t in self.targets:
            fd = os.open(t.file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# -------------------------------------------------------------------------------------------------
# results


def best(trials: list[Trial], op: str) -> Trial | None:
    of_op = [t for t in trials if t.op == op and t.seconds]
    return max(of_op, key=lambda t: t.gbps) if of_op else None


def best_aio_section(trials: list[Trial]) -> dict:
    """The `aio` config section to use: with reads and writes measured, the setting with the best
    harmonic mean of the two (one section serves swap-in and swap-out); else the best of the one
    measured."""
    by_cfg: dict[tuple, dict[str, float]] = {}
    for t in trials:
        by_cfg.setdefault(tuple(t.config[k] for k in KEYS), {})[t.op] = t.gbps
    def score(item):
        bws = list(item[1].values())
        return len(bws), (len(bws) / sum(1 / b for b in bws) if all(bws) else 0.0)
    key, _ = max(by_cfg.items(), key=score)
    return {**dict(zip(KEYS, key)), "use_gds": False}


def summary(sweep: Sweep) -> dict:
    trials = sweep.trials
    section = best_aio_section(trials)
    out = {
        "io_size": sweep.io_size,
        "loops": sweep.loops,
        "backend": sweep.backend,
        "backend_note": sweep.backend_note,
        "dirs": [{"path": str(t.path), "bytes": t.share, "io_mode": t.io_mode} for t in sweep.targets],
        "results": [t.to_json() for t in trials],
        "best": {op: (best(trials, op).to_json() if best(trials, op) else None)
                 for op in ("read", "write")},
        "aio": section,
    }
    validate_aio_section(section)
    return out


def validate_aio_section(section: dict) -> None:
    """The section must be accepted by dslaunch's config resolver as it is."""
    from dslaunch.config import resolve_config

    resolve_config({"train_micro_batch_size_per_gpu": 1, "aio": section}, world_size=1)
