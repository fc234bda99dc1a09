"""The hang watchdog: decides from the agents' heartbeats that a job is stuck, and says where.

Fed with every agent event (``event``), asked on every controller tick (``poll``); no I/O, no
clock of its own (the caller passes ``now``, a monotonic time), so the unit tests drive it.

- **hang**: every running rank's progress record (``progress_record.py``: step counter, current
  collective) has stayed the same for ``hang_timeout`` seconds. Idleness is measured by the agents
  on their own clocks (``idle`` in each heartbeat) and aged here by the time since the heartbeat
  arrived. A rank not heard of yet counts as progressing until ``hang_timeout`` after the watchdog
  started (imports, rendezvous). A slow job whose ranks still step or enter collectives never trips
  it; one rank computing while the others wait for it is a hang only once the timeout has passed
  for all of them. Once some rank finished (exit 0) and no running rank waits in a collective, the
  job is ending: the last ranks' teardown gets ``ENDING_FACTOR`` x the timeout (``_ending``).
- **desync**: two ranks of a group entered different collectives under the same sequence number
  of that group (rank 1 in all_gather #5 on world, the others in reduce_scatter #5: the ZeRO-3
  divergent-path deadlock). Every rank numbers its collectives per group the same way, so one such
  pair is proof: reported at the heartbeat that shows it, without waiting for the timeout.

On a verdict ``poll`` first asks for the stacks of the suspects (``Action("dump", ...)``: the
controller sends ``dump stacks R..`` to the agents), then, once they are in or ``STACK_WAIT``
has passed, returns the report (``Action("report", ...)``): one screen saying which ranks are
stuck where, what the waiting ranks wait in, and a one-line diagnosis. A hang verdict whose ranks
moved on meanwhile (a record changed, or every rank ended: a loaded host's slow teardown) is
withdrawn instead (``Action("withdraw")``) and the watch goes on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

STACK_WAIT = 2.5  # seconds to wait for the suspects' stacks (agent: <= 1.5 s, plus the way back)
# after the first sign of a desync, how long the other nodes get to report theirs (a heartbeat
# each), so the report sees every rank's side and asks for the right stacks
DESYNC_SETTLE = 1.5
MAX_STACKS = 4  # suspects shown with a stack (one screen)
# once some rank finished and the rest wait in no collective (the job's teardown), the hang
# timeout is stretched to this many times itself, at least ENDING_MIN seconds
ENDING_FACTOR = 4
ENDING_MIN = 60.0
MAX_FRAMES = 8
P2P_GROUP = "p2p"  # point-to-point calls: numbered per process, never compared across ranks
_KEEP_SEQS = 256  # per group, how far back the (group, seq) -> op memory reaches


@dataclass
class Action:
    # "dump": ask the agents for these ranks' stacks; "report": fail the job with it;
    # "withdraw": the ranks moved on while their stacks came (no hang after all)
    kind: str
    ranks: list = field(default_factory=list)
    verdict: str = ""  # "hang" | "desync"
    headline: str = ""  # the one-line diagnosis
    report: str = ""  # the one-screen report
    wall_time: float = 0.0  # when the verdict was reached (the failure's time, errors.py)


@dataclass
class _Rank:
    host: str
    record: dict | None = None
    idle: float = 0.0  # seconds without progress, as of ``at``
    at: float = 0.0  # our monotonic time of the heartbeat that said so
    hb_time: float = 0.0  # the agent's wall clock in that heartbeat (ages the record's times)
    exited: bool = False
    finished: bool = False  # exited with code 0
    stack: str = ""
    native: str | None = None


def group_members(label: str, known: list) -> list | None:
    """The global ranks of a group label made by ``engine/comm/collectives.group_label`` ("world", "ranks
    0-3,8"); None when the label does not list them (a digest)."""
    if label == "world":
        return sorted(known)
    m = re.fullmatch(r"ranks ([0-9,\-]+)", label)
    if not m:
        return None
    out = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def ranks_text(ranks) -> str:
    """"rank 3" / "ranks 0-2,5,7" (runs of three or more collapsed)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            runs.append(f"{ranks[i]}-{ranks[j]}")
        else:
            runs.extend(str(x) for x in ranks[i:j + 1])
        i = j + 1
    return "ranks " + ",".join(runs)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


# ---- stacks ---------------------------------------------------------------------------------------
_FRAME = re.compile(r'\s*File "(.*)", line (\d+) in (.*)')
_LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python\d\.\d+/|^<|/dslaunch/"
                      r"(launcher|engine|runtime|comm|checkpoint|zero|ops|utils)\b)")


def main_thread_frames(text: str) -> list:
    """[(file, line, function)] of the thread running the script, innermost first, down to the
    script's own first frame, from a faulthandler dump (all threads); the thread with the
    bootstrap's frames, else the first."""
    threads, cur = [], None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            cur = []
            threads.append(cur)
        elif cur is not None:
            m = _FRAME.match(line)
            if m:
                cur.append((m.group(1), int(m.group(2)), m.group(3)))
    for frames in threads:
        if any(_launch_frame(f) or f[2] == "<module>" for f in frames):
            # the frames below the script (runpy, the bootstrap) are the same in every dump
            cut = next((i for i, f in enumerate(frames) if _launch_frame(f)), len(frames))
            return frames[:cut]
    return threads[0] if threads else []


def _launch_frame(frame: tuple) -> bool:
    name = frame[0]
    return (name in ("<frozen runpy>",) or name.endswith(("/runpy.py", "/launcher/bootstrap.py")))


def where(frames: list) -> str:
    """"wait_for_lock (train.py:88)": the innermost frame of the user's code (not the standard
    library's, torch's or dslaunch's), else the innermost one."""
    if not frames:
        return ""
    pick = next((f for f in frames if not _LIBRARY.search(f[0])), frames[0])
    return f"{pick[2]} ({os.path.basename(pick[0])}:{pick[1]})"


# ---- the watchdog -----------------------------------------------------------------------------
class Watchdog:
    def __init__(self, hang_timeout: float, ranks: dict, now: float):
        """``ranks``: {global rank: host} of the ranks this controller runs; ``now``: monotonic
        time of their start."""
        self.hang_timeout = float(hang_timeout)
        self.ranks = {int(r): _Rank(host, at=now) for r, host in ranks.items()}
        self._seen: dict = {}  # (group, seq) -> {op: set(ranks)}
        self._top: dict = {}  # group -> highest seq seen
        self._desync: tuple | None = None  # (group, seq, {op: ranks}) once found (kept live)
        self._desync_at = 0.0
        self._verdict: Action | None = None
        self._asked: set = set()
        self._records_at_verdict: dict = {}  # rank -> its record when the hang verdict came
        self._deadline = 0.0
        self._reported = False
        self._now = now

    # ---- input ---------------------------------------------------------------------------------
    def event(self, ev: dict, now: float) -> None:
        self._now = now
        name = ev.get("event")
        if name == "heartbeat":
            if "idle" not in ev:  # an agent of an older dslaunch: no verdict on its ranks
                for r in self.ranks.values():
                    if r.host == ev.get("host"):
                        r.idle, r.at = 0.0, now
                return
            idle = ev["idle"]
            progress = ev.get("progress") or {}
            for key, seconds in idle.items():
                r = self.ranks.get(int(key))
                if r is None:
                    continue
                r.idle, r.at, r.hb_time = float(seconds), now, float(ev.get("time") or 0.0)
                rec = progress.get(key)
                if rec is not None:
                    r.record = rec
                    self._observe(int(key), rec)
        elif name == "exit":
            r = self.ranks.get(int(ev.get("rank", -1)))
            if r is not None:
                r.exited = True
                r.finished = ev.get("returncode") == 0
        elif name == "stacks":
            for key, st in (ev.get("stacks") or {}).items():
                r = self.ranks.get(int(key))
                if r is not None:
                    r.stack = st.get("python", r.stack) or r.stack
                    r.native = st.get("native", r.native)

    def _observe(self, rank: int, rec: dict) -> None:
        for op, group, seq in ((rec.get("coll_op"), rec.get("coll_group"), rec.get("coll_seq")),
                               (rec.get("last_op"), rec.get("last_group"), rec.get("last_seq"))):
            if not op or not seq or group == P2P_GROUP:
                continue
            ops = self._seen.setdefault((group, seq), {})
            ops.setdefault(op, set()).add(rank)
            if len(ops) > 1 and self._desync is None:
                self._desync, self._desync_at = (group, seq, ops), self._now
            if seq > self._top.get(group, 0):
                self._top[group] = seq
        if len(self._seen) > 4 * _KEEP_SEQS:
            self._seen = {k: v for k, v in self._seen.items()
                          if k[1] > self._top.get(k[0], 0) - _KEEP_SEQS}

    # ---- state ---------------------------------------------------------------------------------
    def idle(self, rank: int, now: float) -> float:
        r = self.ranks[rank]
        return r.idle + (now - r.at)

    def running(self) -> list:
        return sorted(k for k, r in self.ranks.items() if not r.exited)

    def hung(self, now: float) -> bool:
        running = self.running()
        limit = self.hang_timeout
        if self._ending(running):
            limit = max(ENDING_FACTOR * limit, ENDING_MIN)
        return bool(running) and all(self.idle(k, now) >= limit for k in running)

    def _ending(self, running: list) -> bool:
        """Some rank finished (exit 0) and no running rank waits in a collective: the job is
        ending, and the last ranks' teardown (destroying the group, interpreter exit) may sit
        idle for a while on a loaded host. Ranks left waiting in a collective on one that
        finished early are a hang at the ordinary timeout."""
        return any(r.finished for r in self.ranks.values()) and not any(
            (self.ranks[k].record or {}).get("coll_op") for k in running)

    # ---- output --------------------------------------------------------------------------------
    def poll(self, now: float, wall: float = 0.0) -> Action | None:
        """What the controller should do now: nothing (None), ask for stacks, or report."""
        if self._reported:
            return None
        if self._verdict is None:
            if self._desync is not None and now >= self._desync_at + DESYNC_SETTLE:
                kind = "desync"
            elif self.hang_timeout > 0 and self.hung(now):
                kind = "hang"
            else:
                return None
            self._verdict = Action("dump", verdict=kind, wall_time=wall)
            self._verdict.ranks = self.suspects(now) or self.running()[:MAX_STACKS]
            self._asked = set(self._verdict.ranks)
            self._records_at_verdict = {k: self.ranks[k].record for k in self.running()}
            self._deadline = now + STACK_WAIT
            return Action("dump", ranks=list(self._verdict.ranks), verdict=kind, wall_time=wall)
        have = {k for k in self._asked if self.ranks[k].stack or self.ranks[k].exited}
        if have != self._asked and now < self._deadline:
            return None
        v = self._verdict
        if v.verdict == "hang" and self._moved_on():
            # while the stacks came, a rank left its place or every rank ended: a slow stretch
            # (a loaded host's teardown), no hang; the clocks go on from the heartbeats
            for k in self._asked:
                self.ranks[k].stack, self.ranks[k].native = "", None
            self._verdict, self._asked = None, set()
            return Action("withdraw", verdict=v.verdict, wall_time=wall)
        self._reported = True
        headline, report = self.report(v.verdict, now)
        return Action("report", ranks=v.ranks, verdict=v.verdict, headline=headline,
                      report=report, wall_time=v.wall_time)

    def _moved_on(self) -> bool:
        """Since the hang verdict: every rank has exited, or a running rank's record changed
        (a collective entered or left, a step). CPU time does not count here: dumping a stack
        costs some."""
        running = self.running()
        if not running:
            return True
        before = self._records_at_verdict
        return any(k in before and self.ranks[k].record != before[k] for k in running)

    def _waiting(self) -> dict:
        """{(group, seq, op): [ranks]} of the running ranks inside a collective."""
        out: dict = {}
        for k in self.running():
            rec = self.ranks[k].record
            if rec and rec.get("coll_op"):
                out.setdefault((rec["coll_group"], rec["coll_seq"], rec["coll_op"]), []).append(k)
        return out

    def _main_wait(self):
        """The collective most running ranks wait in: ((group, seq, op), ranks), or None. One
        that a member keeps waiting from outside any call comes first: with pipeline stages the
        waits split over several groups (a stage's data-parallel all-reduce, its neighbour's
        receive), and only the group the stuck rank belongs to names it."""
        waiting = {k: v for k, v in self._waiting().items() if k[0] != P2P_GROUP}
        if not waiting:
            return None
        running = self.running()

        def held_from_outside(group, waiters) -> bool:
            members = group_members(group, list(self.ranks)) or running
            return any(k in running and k not in waiters
                       and not (self.ranks[k].record or {}).get("coll_op") for k in members)

        return max(waiting.items(),
                   key=lambda kv: (held_from_outside(kv[0][0], kv[1]), len(kv[1]), -kv[0][1]))

    def suspects(self, now: float) -> list:
        """The ranks that keep the others waiting (their stacks are the report's point)."""
        if self._desync is not None:
            return self._odd_ranks()[:MAX_STACKS]
        main = self._main_wait()
        running = self.running()
        if main is None:
            return running[:MAX_STACKS]
        (group, _, _), waiters = main
        members = group_members(group, list(self.ranks)) or running
        missing = [k for k in members if k in running and k not in waiters]
        return (missing or running)[:MAX_STACKS]

    def _odd_ranks(self) -> list:
        """The desync's ranks outside its largest side (every side's on a tie)."""
        sides = sorted(self._desync[2].values(), key=len, reverse=True)
        if len(sides) > 1 and len(sides[0]) == len(sides[1]):
            return sorted(set().union(*sides))
        return sorted(set().union(*sides[1:]))

    def _where(self, k: int) -> str:
        return where(main_thread_frames(self.ranks[k].stack))

    def _in(self, k: int) -> str:
        w = self._where(k)
        return f"{ranks_text([k])} is in {w}" if w else f"{ranks_text([k])}: no stack"

    def diagnosis(self, kind: str, now: float) -> str:
        if kind == "desync":
            group, seq, ops = self._desync
            parts = [f"{ranks_text(rs)} called {op}" for op, rs in
                     sorted(ops.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
            where_ = "; ".join(self._in(k) for k in self._odd_ranks()[:MAX_STACKS])
            return (f"collective #{seq} on {group} differs across ranks: {', '.join(parts)} "
                    f"(ranks took different code paths)" + (f"; {where_}" if where_ else ""))
        main = self._main_wait()
        running = self.running()
        if main is None:
            where_ = "; ".join(self._in(k) for k in self.suspects(now))
            return f"no rank is in a collective: every rank is stuck outside one; {where_}"
        (group, seq, op), waiters = main
        members = group_members(group, list(self.ranks)) or running
        missing = [k for k in members if k in running and k not in waiters]
        if not missing:
            return (f"every rank of {group} waits in {op} #{seq}: the collective itself makes no "
                    "progress (network, or a peer outside this launcher)")
        elsewhere = []
        for k in missing:
            rec = self.ranks[k].record
            if rec and rec.get("coll_op"):
                elsewhere.append(f"{ranks_text([k])} waits in {rec['coll_op']} "
                                 f"#{rec['coll_seq']} on {rec['coll_group']} instead")
            else:
                elsewhere.append(self._in(k))
        return (f"{ranks_text(missing)} never entered {op} #{seq} on {group} that "
                f"{ranks_text(waiters)} wait in; " + "; ".join(elsewhere[:MAX_STACKS]))

    def report(self, kind: str, now: float) -> tuple:
        """(headline, one-screen report)."""
        headline = self.diagnosis(kind, now)
        running = self.running()
        if kind == "desync":
            lines = ["hang watchdog: collectives desynchronised"]
        else:
            idle = min(self.idle(k, now) for k in running) if running else 0.0
            lines = [f"hang watchdog: no rank has made progress for {idle:.1f} s "
                     f"(hang timeout {self.hang_timeout:g} s)"]
        for (group, seq, op), ranks in sorted(self._waiting().items()):
            recs = [self.ranks[k] for k in ranks]
            since = max(r.hb_time - (r.record.get("coll_since") or r.hb_time) + (now - r.at)
                        for r in recs)
            hosts = ",".join(sorted({r.host for r in recs}))
            nbytes = recs[0].record.get("coll_bytes") or 0
            verb = "waits" if len(ranks) == 1 else "wait"
            lines.append(f"  {ranks_text(ranks)} ({hosts}) {verb} in {op} #{seq} on {group}, "
                         f"{_bytes(nbytes)}, for {since:.1f} s")
        suspects = self.suspects(now)
        for k in suspects:
            r = self.ranks[k]
            rec = r.record or {}
            state = (f"in {rec['coll_op']} #{rec['coll_seq']} on {rec['coll_group']}"
                     if rec.get("coll_op") else "not in a collective")
            last = (f"; last {rec['last_op']} #{rec['last_seq']} on {rec['last_group']}"
                    if rec.get("last_op") else "")
            step = f"; step {rec['step']}" if rec.get("step", -1) >= 0 else ""
            lines.append(f"  {ranks_text([k])} ({r.host}): {state}{last}{step}; no progress "
                         f"for {self.idle(k, now):.1f} s")
            frames = main_thread_frames(r.stack)
            for f in frames[:MAX_FRAMES]:
                lines.append(f'      File "{f[0]}", line {f[1]} in {f[2]}')
            if len(frames) > MAX_FRAMES:
                lines.append(f"      ... {len(frames) - MAX_FRAMES} more frame(s)")
            if not frames:
                lines.append("      (no Python stack came back)")
            if r.native:
                native = r.native.strip().splitlines()
                lines.append("    native (py-spy):")
                lines += [f"      {x}" for x in native[:MAX_FRAMES]]
        others = [k for k in running if k not in suspects and not self.ranks[k].record]
        if others:
            lines.append(f"  {ranks_text(others)}: no progress record (not in dslaunch's comm "
                         "layer yet)")
        lines.append(f"  diagnosis: {headline}")
        return headline, "\n".join(lines)
