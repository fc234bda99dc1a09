"""The live job view: what each rank is doing, built from the agents' heartbeats. What
``dslaunch run --monitor`` shows, what the status file ``dslaunch top`` reads holds, and what the
straggler report (``stragglers.py``) judges.

Every figure comes from the rank's own progress record (``progress_record.py``), sent by its node's
agent in each heartbeat, so it works on every host the launcher reaches. A step's time and the time
spent in collectives are differences of one rank's own stamps and counters: hosts' clocks need
not agree. Two figures per rank:

- **live** (the table): over the records of the last ``WINDOW`` seconds;
- **job** (the straggler report): from the first record past step 1 (the first step carries
  start-up work) to the last one, the exit event's included.

"Compute" is a step's time outside collectives (forward, backward, the optimizer, data loading,
host work); "in collectives" is the time inside the comm layer's collectives (waiting for the
others and moving the bytes). Collectives made with ``torch.distributed`` directly count as compute.

The status file (``DIR/status.json`` with ``--log-dir DIR``) is replaced atomically about once a
second, so a reader never sees half of one. No torch, no rich here.
"""

from __future__ import annotations

import collections
import json
import os
import time

STATUS_FILE = "status.json"
STATUS_VERSION = 1
WINDOW = 10.0  # seconds of recent records the live figures average over
PUBLISH_EVERY = 1.0  # seconds between status file writes (and live table refreshes)


def rates(a: dict | None, b: dict) -> dict:
    """Per-step figures between two records of one rank (``a`` earlier, or None: ``b``'s last
    step alone): step_time, collectives, compute (seconds per step), tokens_per_s, steps."""
    out = {"step_time": None, "collectives": None, "compute": None, "tokens_per_s": None,
           "steps": 0}
    if a is not None and b["step"] > a["step"] >= 0:
        n = b["step"] - a["step"]
        span = b["step_time"] - a["step_time"]
        out.update(step_time=span / n, collectives=(b["step_coll_total"] - a["step_coll_total"]) / n,
                   steps=n)
        if b.get("tokens", -1) >= 0 and a.get("tokens", -1) >= 0 and span > 0:
            out["tokens_per_s"] = (b["tokens"] - a["tokens"]) / span
    elif b.get("step_dt", 0.0) > 0:
        out.update(step_time=b["step_dt"], collectives=b["step_coll"], steps=1)
    if out["step_time"] is not None:
        out["collectives"] = min(max(out["collectives"], 0.0), out["step_time"])
        out["compute"] = out["step_time"] - out["collectives"]
    return out


class RankView:
    def __init__(self, rank: int, host: str):
        self.rank, self.host = rank, host
        self.first: dict | None = None  # the job window's start: first record past step 1
        self.recent: collections.deque = collections.deque()  # (monotonic, record), steps changed
        self.last: dict | None = None
        self.rss: int | None = None
        self.heard: float | None = None  # monotonic time of the last heartbeat that carried it
        self.returncode: int | None = None

    def record(self, rec: dict, now: float) -> None:
        if rec.get("step", -1) < 0:
            self.last = rec
            return
        if self.first is None and rec["step"] >= 1:
            self.first = rec
        if not self.recent or self.recent[-1][1]["step"] != rec["step"]:
            self.recent.append((now, rec))
        while len(self.recent) > 2 and now - self.recent[0][0] > WINDOW:
            self.recent.popleft()
        self.last = rec

    def live(self, now: float) -> dict:
        row = {"rank": self.rank, "host": self.host, "step": None, "rss": self.rss,
               "device_mem": None, "heartbeat_age": None if self.heard is None else now - self.heard,
               "state": self.state()}
        if self.last is not None:
            row["step"] = self.last["step"] if self.last["step"] >= 0 else None
            mem = self.last.get("device_mem", -1)
            row["device_mem"] = mem if mem >= 0 else None
            start = next((r for _, r in self.recent if r["step"] >= 1), None)
            row.update(rates(start if start is not self.last else None, self.last)
                       if self.last["step"] >= 0 else rates(None, self.last))
        return row

    def job(self) -> dict:
        row = {"rank": self.rank, "host": self.host, "first_step": None, "last_step": None}
        if self.last is not None and self.last["step"] >= 0:
            first = self.first if self.first is not self.last else None
            row.update(rates(first, self.last), last_step=self.last["step"],
                       first_step=first["step"] if first is not None else self.last["step"] - 1)
        return row

    def state(self) -> str:
        if self.returncode is not None:
            return f"exited {self.returncode}"
        if self.last is not None and self.last.get("coll_op"):
            return f"in {self.last['coll_op']}"
        return "running" if self.heard is not None else "starting"


class JobView:
    """Fed the controller's events (``heartbeat``, ``exit``), gives rows and the status file."""

    def __init__(self, hosts: dict, attempt: int = 0):
        self.ranks = {r: RankView(r, h) for r, h in sorted(hosts.items())}
        self.attempt = attempt
        self.last_publish = 0.0

    def event(self, ev: dict, now: float) -> None:
        name = ev.get("event")
        if name == "heartbeat":
            rss = ev.get("rss") or {}
            for key in (ev.get("idle") or ev.get("progress") or {}):
                view = self.ranks.get(int(key))
                if view is None:
                    continue
                view.heard = now
                if rss.get(key):  # 0: a rank caught exiting (a zombie has no memory): keep
                    view.rss = int(rss[key])  # its last known figure
                rec = (ev.get("progress") or {}).get(key)
                if rec is not None:
                    view.record(rec, now)
        elif name == "exit":
            view = self.ranks.get(int(ev.get("rank", -1)))
            if view is not None:
                view.returncode = ev.get("returncode")
                if ev.get("progress"):
                    view.record(ev["progress"], now)

    def live(self, now: float) -> list:
        return [v.live(now) for v in self.ranks.values()]

    def job(self) -> list:
        return [v.job() for v in self.ranks.values()]

    def snapshot(self, now: float, state: str = "running", threshold: float | None = None) -> dict:
        """The status file's content: JSON-ready, ages as of ``time`` (wall clock)."""
        return {"version": STATUS_VERSION, "time": time.time(), "state": state,
                "launcher_pid": os.getpid(), "attempt": self.attempt, "threshold": threshold,
                "ranks": self.live(now), "job": self.job()}

    def due(self, now: float) -> bool:
        if now - self.last_publish >= PUBLISH_EVERY:
            self.last_publish = now
            return True
        return False


def write_status(log_dir: str, snapshot: dict) -> None:
    """Replace ``log_dir``/status.json atomically (write a temporary file, then rename)."""
    path = os.path.join(log_dir, STATUS_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(snapshot, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:  # a full disk must not stop the job: the view is a convenience
        try:
            os.unlink(tmp)
        except OSError:
            pass


def read_status(log_dir: str) -> dict | None:
    """The last status a launcher wrote in ``log_dir``, or None when there is none."""
    try:
        with open(os.path.join(log_dir, STATUS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "ranks" in data else None
