"""What an agent reads from its running ranks for the launcher: their progress records and
idleness (the hang watchdog's input, every heartbeat), their resident memory (the live job view's
column), and their stacks on request (Python's from the bootstrap's faulthandler, native ones from
py-spy when it is installed). No torch; psutil only inside ``memory``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from dslaunch import progress_record
from dslaunch.launcher.idleness import cpu_ticks

STACK_WAIT = 1.5  # how long a "dump stacks" waits for a rank's faulthandler file (a busy host may
# take a while to schedule the rank that must handle the signal)
PYSPY_TIMEOUT = 1.5


def progress(ranks) -> tuple:
    """({rank: its last progress record} for the running ``ranks`` that wrote one, {rank: seconds
    without progress (idleness.py)} for every running rank)."""
    found, idle = {}, {}
    now, wall = time.monotonic(), time.time()
    for r in ranks:
        if r.proc.poll() is None:
            rec = progress_record.read(r.progress_file)
            if rec is not None:
                found[str(r.rank)] = rec
            idle[str(r.rank)] = r.idleness.update(rec, cpu_ticks(r.proc.pid), now, wall)
    return found, idle


def memory(ranks) -> dict:
    """{rank: resident memory in bytes} of the running ``ranks``."""
    import psutil  # here, not at import: starting ranks must stay cheap

    rss = {}
    for r in ranks:
        if r.proc.poll() is None:
            try:
                value = psutil.Process(r.proc.pid).memory_info().rss
            except (psutil.Error, OSError):
                continue
            if value:  # 0: exited, not yet reaped (a zombie): no figure
                rss[str(r.rank)] = value
    return rss


def python_stacks(ranks) -> dict:
    """{rank: {"python": its stacks}} of ``ranks``: the bootstrap's faulthandler appends them to
    the rank's stack file on SIGUSR2."""
    sizes = {}
    for r in ranks:
        try:
            sizes[r.rank] = os.path.getsize(r.stack_file)
        except OSError:
            sizes[r.rank] = 0
        try:
            os.kill(r.proc.pid, signal.SIGUSR2)
        except ProcessLookupError:
            pass
    return {str(r.rank): {"python": _read_new(r.stack_file, sizes[r.rank])} for r in ranks}


def native_stacks(ranks) -> dict | None:
    """{rank: {"native": py-spy's dump}} of ``ranks`` (slower than Python's); None without
    py-spy or ranks."""
    if not ranks or not shutil.which("py-spy"):
        return None
    return {str(r.rank): {"native": _pyspy(r.proc.pid)} for r in ranks}


def _read_new(path: str, start: int) -> str:
    """What a rank's faulthandler appended to ``path`` after byte ``start``: waits until the file
    has grown and then stays the same for a moment (the dump is written in pieces), at most
    STACK_WAIT seconds."""
    deadline = time.monotonic() + STACK_WAIT
    last = start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if size > start and size == last:
            break
        last = size
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(256 * 1024).decode("utf-8", "replace")
    except OSError:
        return ""


def _pyspy(pid: int) -> str | None:
    """``py-spy dump --native`` of the rank when py-spy is installed (not a dependency)."""
    exe = shutil.which("py-spy")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=PYSPY_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy failed: {exc}"
    return out.stdout if out.returncode == 0 else f"py-spy failed: {out.stderr.strip()[-300:]}"
