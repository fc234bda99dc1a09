"""A build lock that works across processes and hosts sharing a cache directory.

The lock is a file created with O_EXCL holding ``{"pid", "host", "started", "token"}``. While held,
a thread touches it every few seconds (heartbeat). A waiter takes the lock over, instead of
waiting, when the holder is provably gone:
  * same host and the PID no longer exists (a killed build), or
  * another host and the heartbeat is older than ``stale_after`` seconds, or
  * the file is unreadable/empty and older than ``stale_after`` (died between create and write).
Take-over re-checks the holder under a short flock on ``<lock>.guard`` so two waiters cannot both
remove it (the second would otherwise delete the first one's fresh lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid


class LockTimeout(TimeoutError):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_holder(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


class BuildLock:
    def __init__(self, path: str, stale_after: float = 60.0, heartbeat: float = 5.0,
                 timeout: float = 1800.0, poll: float = 0.1, on_wait=None):
        self.path, self.stale_after, self.heartbeat = path, stale_after, heartbeat
        self.timeout, self.poll, self.on_wait = timeout, poll, on_wait
        self.token = uuid.uuid4().hex
        self.took_over: dict | None = None  # the stale holder we replaced, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- staleness -------------------------------------------------------------------------------
    def _is_stale(self, holder: dict | None) -> bool:
        try:
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return False  # gone: just retry the create
        if holder is None or "pid" not in holder:
            return age > self.stale_after
        if holder.get("host") == socket.gethostname():
            return not _pid_alive(int(holder["pid"]))
        return age > self.stale_after

    def _take_over(self, holder: dict | None) -> None:
        with open(self.path + ".guard", "a") as guard:
            with contextlib.suppress(OSError):
                fcntl.flock(guard, fcntl.LOCK_EX)
            now = read_holder(self.path)
            same = (now or {}).get("token") == (holder or {}).get("token")
            if same and self._is_stale(now):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                self.took_over = holder or {}

    # -- acquire / release -----------------------------------------------------------------------
    def acquire(self) -> "BuildLock":
        deadline = time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(self.path)
                if self._is_stale(holder):
                    self._take_over(holder)
                    continue
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{self.path} held by {holder} for over {self.timeout:.0f}s") from None
                if not told and self.on_wait is not None:
                    self.on_wait(holder)
                    told = True
                time.sleep(self.poll)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.time(), "token": self.token}, f)
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
            return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if (read_holder(self.path) or {}).get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
