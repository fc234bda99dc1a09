"""One rank's progress as a fixed-size record in a small file: the rank writes, its node agent
reads. The channel of the hang watchdog (``launcher/watchdog.py``) and of the restart policy.

Why a memory-mapped file: a write is a ``struct.pack_into`` into shared memory (about a
microsecond, no system call), so it can run at every collective; the agent reads it at every
heartbeat without asking the rank anything, which matters because the rank to read is the one
that is stuck. The agent names the file in ``DSLAUNCH_PROGRESS_FILE``; without it (torchrun,
srun, a plain ``python train.py``) ``writer()`` is None and nothing is written.

A write is guarded by a sequence counter (odd while a write is in progress, as a seqlock), so
a reader never takes half of one update for a whole one.

Imports nothing of dslaunch and no torch: both the engine (writer) and the launcher (reader) use
it, and neither may import the other.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

ENV = "DSLAUNCH_PROGRESS_FILE"

# seq, pid, updated, step, step_time, coll_seq, coll_since, coll_bytes, coll_op, coll_group,
# last_seq, last_op, last_group, ckpt_saved_step, ckpt_saved_time, ckpt_loaded_step (224 bytes:
# the first version), then what the live job view reads (launcher/jobview.py): coll_total,
# step_coll_total, step_dt, step_coll, tokens, device_mem. New fields only ever go at the end: a
# reader of an older version reads its prefix unchanged, and read() fills what an older writer
# lacks with the defaults below.
_FORMAT_V1 = "<Qqdqdqdq16s48sq16s48sqdq"
_FORMAT = _FORMAT_V1 + "ddddqq"
_RECORD = struct.Struct(_FORMAT)  # compiled once: a write is on every collective
_RECORD_V1 = struct.Struct(_FORMAT_V1)
_SEQ = struct.Struct("<Q")
SIZE = _RECORD.size
SIZE_V1 = _RECORD_V1.size
_V2_DEFAULTS = {"coll_total": 0.0, "step_coll_total": 0.0, "step_dt": 0.0, "step_coll": 0.0,
                "tokens": -1, "device_mem": -1}
_TEXT = {"coll_op": 16, "coll_group": 48, "last_op": 16, "last_group": 48}
_ENCODED: dict = {}  # (text, width) -> bytes: a job uses a handful of op and group names


def _text(value: str, width: int) -> bytes:
    key = (value, width)
    raw = _ENCODED.get(key)
    if raw is None:
        raw = value.encode("utf-8", "replace")[:width]
        if len(_ENCODED) < 4096:
            _ENCODED[key] = raw
    return raw


class ProgressWriter:
    """The rank's side. Every method is cheap enough to call on every collective."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self.v = {"pid": os.getpid(), "updated": time.time(), "step": -1, "step_time": 0.0,
                  "coll_seq": 0, "coll_since": 0.0, "coll_bytes": 0, "coll_op": "",
                  "coll_group": "", "last_seq": 0, "last_op": "", "last_group": "",
                  "ckpt_saved_step": -1, "ckpt_saved_time": 0.0, "ckpt_loaded_step": -1,
                  **_V2_DEFAULTS}
        self._group_seq: dict = {}  # group -> collectives entered on it (its sequence number)
        self._flush()

    def _flush(self, now: float | None = None) -> None:
        v = self.v
        v["updated"] = time.time() if now is None else now
        self._seq += 1  # odd: writing
        _SEQ.pack_into(self._map, 0, self._seq)
        _RECORD.pack_into(
            self._map, 0, self._seq, v["pid"], v["updated"], v["step"],
            v["step_time"], v["coll_seq"], v["coll_since"], v["coll_bytes"],
            _text(v["coll_op"], 16), _text(v["coll_group"], 48), v["last_seq"],
            _text(v["last_op"], 16), _text(v["last_group"], 48), v["ckpt_saved_step"],
            v["ckpt_saved_time"], v["ckpt_loaded_step"], v["coll_total"], v["step_coll_total"],
            v["step_dt"], v["step_coll"], v["tokens"], v["device_mem"])
        self._seq += 1  # even: whole
        _SEQ.pack_into(self._map, 0, self._seq)

    def step(self, global_step: int, tokens: int = -1, device_mem: int = -1) -> None:
        """The training step counter advanced (an optimizer step, skipped or not). ``tokens``:
        token ids this rank has consumed so far (-1: unknown); ``device_mem``: bytes allocated on
        its accelerator now (-1: none or unknown)."""
        v = self.v
        now = time.time()
        if v["step"] >= 0:  # the step just ended: its length and its share spent in collectives
            v["step_dt"] = now - v["step_time"]
            v["step_coll"] = v["coll_total"] - v["step_coll_total"]
        v["step"], v["step_time"], v["step_coll_total"] = int(global_step), now, v["coll_total"]
        v["tokens"], v["device_mem"] = int(tokens), int(device_mem)
        self._flush(now)

    def enter(self, op: str, group: str, nbytes: int = 0) -> int:
        """A collective ``op`` on ``group`` begins; returns its sequence number on that group."""
        seq = self._group_seq.get(group, 0) + 1
        self._group_seq[group] = seq
        now = time.time()
        self.v.update(coll_seq=seq, coll_since=now, coll_bytes=int(nbytes), coll_op=op,
                      coll_group=group)
        self._flush(now)
        return seq

    def new_groups(self) -> None:
        """The process groups were made anew (in-process recovery: ``recovery/rejoin.py``'s
        ``_join_group``, on survivors and replacements alike): every group's sequence numbers
        start again at 1, as on every other member. Kept across it, a survivor's numbers ran ahead
        of a replacement's by all the collectives before the fault, and the hang watchdog took
        their different collectives under one number for a desync."""
        self._group_seq.clear()
        self.v.update(coll_seq=0, coll_since=0.0, coll_bytes=0, coll_op="", coll_group="",
                      last_seq=0, last_op="", last_group="")
        self._flush()

    def resume(self, op: str, group: str, seq: int, nbytes: int = 0) -> None:
        """The rank waits for collective ``seq`` of ``group``, entered earlier (an async call's
        ``wait()``): shown as in it again, the sequence unchanged."""
        now = time.time()
        self.v.update(coll_seq=int(seq), coll_since=now, coll_bytes=int(nbytes), coll_op=op,
                      coll_group=group)
        self._flush(now)

    def leave(self) -> None:
        """The collective entered last has completed."""
        v = self.v
        now = time.time()
        if v["coll_since"]:  # cumulative time in collectives (an async one: from its wait())
            v["coll_total"] += max(0.0, now - v["coll_since"])
        v.update(last_seq=v["coll_seq"], last_op=v["coll_op"], last_group=v["coll_group"],
                 coll_seq=0, coll_since=0.0, coll_bytes=0, coll_op="", coll_group="")
        self._flush(now)

    def checkpoint_saved(self, global_step: int) -> None:
        self.v["ckpt_saved_step"], self.v["ckpt_saved_time"] = int(global_step), time.time()
        self._flush()

    def checkpoint_loaded(self, global_step: int) -> None:
        self.v["ckpt_loaded_step"] = int(global_step)
        self._flush()


def read(path: str, tries: int = 5) -> dict | None:
    """The last whole record in ``path``, or None when there is none (not written yet, unreadable,
    or always mid-write). ``coll_op`` is "" when the rank is not in a collective. A record of the
    first, shorter version (an older writer) reads with the later fields at their defaults."""
    try:
        with open(path, "rb") as f:
            raw = f.read(SIZE)
    except OSError:
        return None
    for _ in range(tries):
        if len(raw) < SIZE_V1:
            return None
        layout = _RECORD if len(raw) >= SIZE else _RECORD_V1
        fields = layout.unpack(raw[:layout.size])
        if fields[0] % 2 == 0:
            break
        time.sleep(0.001)
        try:
            with open(path, "rb") as f:
                raw = f.read(SIZE)
        except OSError:
            return None
    else:
        return None
    (_, pid, updated, step, step_time, coll_seq, coll_since, coll_bytes, coll_op, coll_group,
     last_seq, last_op, last_group, saved, saved_time, loaded) = fields[:16]
    later = dict(zip(_V2_DEFAULTS, fields[16:])) if len(fields) > 16 else dict(_V2_DEFAULTS)
    return {"pid": pid, "updated": updated, "step": step, "step_time": step_time,
            "coll_seq": coll_seq, "coll_since": coll_since, "coll_bytes": coll_bytes,
            "coll_op": coll_op.rstrip(b"\0").decode("utf-8", "replace"),
            "coll_group": coll_group.rstrip(b"\0").decode("utf-8", "replace"),
            "last_seq": last_seq, "last_op": last_op.rstrip(b"\0").decode("utf-8", "replace"),
            "last_group": last_group.rstrip(b"\0").decode("utf-8", "replace"),
            "ckpt_saved_step": saved, "ckpt_saved_time": saved_time, "ckpt_loaded_step": loaded,
            **later}


_WRITER: ProgressWriter | None = None
_WRITER_PATH: str | None = None


def writer() -> ProgressWriter | None:
    """This process's writer (one per process), or None when no agent asked for progress."""
    global _WRITER, _WRITER_PATH
    path = os.environ.get(ENV)
    if not path:
        return None
    if _WRITER is None or _WRITER_PATH != path:
        try:
            _WRITER, _WRITER_PATH = ProgressWriter(path), path
        except OSError:
            return None
    return _WRITER
