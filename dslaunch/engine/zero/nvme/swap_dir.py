"""Swap directories on the NVMe drive: one per rank, removed when its process is gone.

``make_swap_dir(nvme_path, rank)`` creates ``nvme_path/dslaunch-<host>-<pid>/rank<r>/``, where
the swapped optimizer (``optimizer.py``) and the stage 3 parameter store (``param_store.py``) keep
their files. The directory is removed at exit, on SIGTERM (when no one else handles it) and, for a
rank that was SIGKILLed, by the next job that uses the same ``nvme_path`` (a live job holds an
flock in its directory).
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

KEY = "zero_optimization.offload_optimizer"  # the config section errors name by default
SWAP_PREFIX = "dslaunch-"


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
        remove_swap_dir(d)


def remove_swap_dir(rank_dir: str) -> None:
    """Remove ``rank_dir``, and its job directory once no rank is left in it."""
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
