"""How long a rank has made no progress, as its node agent judges it: the hang watchdog's input
(``idle`` in each heartbeat, ``watchdog.py``).

- A rank progresses when its progress record (``progress_record.py``) changes: a step, a
  collective entered or left.
- Outside a collective it also progresses while it uses CPU time, at least ``BUSY_SHARE`` of a
  core over a look (a heartbeat): it is computing (a long forward, an evaluation, imports, data
  preparation), however long between two collectives. A rank blocked in a wait of its own (a
  sleep, a lock, a socket) uses almost none: the share keeps the few ticks of its background
  threads (gloo's network loop wakes every few seconds) from counting as work.
- Inside a collective only its record counts: a waiting rank may spin (gloo's do), so its CPU
  time says nothing about progress.
- A rank with no record yet (starting: imports, rendezvous; or a script whose collectives nobody
  records) progresses while its CPU time advances at all: an import that waits on the disk of a
  loaded host uses little, and a start is not a hang.
"""

from __future__ import annotations

import os

BUSY_SHARE = 0.05  # of one core: computing, not a waiting process's background noise
MIN_WINDOW = 0.5  # seconds: CPU time is compared over at least this much wall time
try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):
    CLK_TCK = 100


class Idleness:
    """One rank's clock of no progress, fed at every heartbeat."""

    def __init__(self, now: float):
        self.record: dict | None = None
        self.changed_at = self.looked_at = now  # our monotonic clock
        self.ticks: int | None = None  # CPU time at ``ticks_at`` (the start of the window)
        self.ticks_at = now

    def update(self, record: dict | None, ticks: int | None, now: float, wall: float) -> float:
        """Seconds without progress as of ``now`` (monotonic), given the rank's record (None:
        none yet) and its CPU time in clock ticks (None: unknown); ``wall``: time.time() now."""
        if record is not None and record != self.record:
            # changed since the last look: when exactly, the rank's stamp says (this host's
            # clock), never earlier than that last look
            ago = min(max(wall - record["updated"], 0.0), now - self.looked_at)
            self.record, self.changed_at = record, now - ago
        elif record is None and ticks != self.ticks:
            self.changed_at = now  # starting
        elif record is not None and not record.get("coll_op") and self._busy(ticks, now):
            self.changed_at = now  # computing outside a collective
        if record is None or now - self.ticks_at >= MIN_WINDOW or self.ticks is None:
            self.ticks, self.ticks_at = ticks, now
        self.looked_at = now
        return round(now - self.changed_at, 3)

    def _busy(self, ticks: int | None, now: float) -> bool:
        """It used at least BUSY_SHARE of a core since the window began."""
        span = now - self.ticks_at
        if ticks is None or self.ticks is None or span < MIN_WINDOW:
            return False
        return (ticks - self.ticks) / CLK_TCK >= BUSY_SHARE * span


def cpu_ticks(pid: int) -> int | None:
    """The CPU time (user + system, clock ticks) a process has used, from /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None
