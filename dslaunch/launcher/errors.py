"""Why a job failed: the failure record, the root-cause rule and the summary the user reads.

The rule, stated once: the root cause is, of all the failures not caused by our own stop, the one
with the earliest failure time; every other failure is a consequence.

- A failure's time is when it happened: the time the bootstrap recorded the rank's exception,
  else the rank's exit (``failure_time``). Not the time its report arrives: a peer that merely
  lost its connection to the failed rank fails later, but its report can come first.
- A rank whose failure happened once its agent had begun stopping failed because of that stop
  (``caused_by_stop``): its exit event says ``stopped`` and it is never a failure, only counted
  as a stopped rank. A rank whose exception was recorded before the stop is a candidate, even if
  it exited after the stop reached it.
- Ties go to the failure recorded first; consequences are listed earliest first.

The agent applies the first two points (it knows when its stop began), the controller the rest.
No torch here, nor anything from the engine: the agent and the controller import this.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

MAX_CONSEQUENCES_SHOWN = 5  # the summary names only the earliest few later failures


@dataclass
class Failure:
    time: float
    kind: str  # "rank", "lost", "agent", "hang" (the watchdog's verdict, watchdog.py)
    text: str  # the one-line headline
    detail: list = field(default_factory=list)  # traceback tail or last output lines
    detail_title: str = ""
    host: str | None = None  # the culprit's host, when one host is to blame (elastic restarts)
    rank: int | None = None  # the culprit rank, when one rank is
    signal: str | None = None  # a rank killed by a signal we did not send ("SIGKILL")
    peer_lost: bool = False  # the rank's error says a peer's connection went away (a consequence)


# ---- on the agent: what a rank's exit event says ---------------------------------------------
def read_rank_error(path: str, tail_lines: int, torch_path: str = "") -> dict | None:
    """The exception the bootstrap recorded in ``path``, else the one torch's ``@record`` wrote to
    ``torch_path`` (TORCHELASTIC_ERROR_FILE: the script caught its exception after ``@record`` saw
    it, e.g. to ``sys.exit(1)``); None if neither. Only the traceback's last ``tail_lines`` lines
    are kept: the full text is in the rank's own output already."""
    try:
        with open(path) as f:
            error = json.load(f)
    except (OSError, ValueError):
        error = read_torch_error(torch_path) if torch_path else None
    if error:
        lines = error.get("traceback", "").rstrip("\n").splitlines()
        error["traceback_tail"] = lines[-tail_lines:]
        error.pop("traceback", None)
    return error


def read_torch_error(path: str) -> dict | None:
    """Torch's error file (``{"message": {"message": "Type: text", "extraInfo": {"py_callstack",
    "timestamp"}}}``, or a plain string message) in the bootstrap's record format. The time is the
    file's modification time: torch's own timestamp has whole seconds only, too coarse to order
    failures (the root-cause rule)."""
    try:
        with open(path) as f:
            data = json.load(f)
        written = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        text = str(message.get("message", ""))
        extra = message.get("extraInfo") or {}
        callstack = str(extra.get("py_callstack", "")) if isinstance(extra, dict) else ""
    elif isinstance(message, str):
        text, callstack = message, ""
    else:
        return None
    exc_type, sep, rest = text.partition(": ")
    if not sep or " " in exc_type:
        exc_type, rest = "Error", text
    return {"exc_type": exc_type, "message": rest, "traceback": callstack, "time": written,
            "source": "TORCHELASTIC_ERROR_FILE"}


def failure_time(error: dict | None, exited_at: float) -> float:
    """When the rank failed: when its exception happened if it recorded one, else its exit."""
    return error.get("time", exited_at) if error else exited_at


def caused_by_stop(failed_at: float, stop_began: float | None) -> bool:
    """Whether a failure at ``failed_at`` is the doing of a stop that began at ``stop_began``."""
    return stop_began is not None and failed_at >= stop_began


# ---- on the controller: failures, the root cause, the summary ------------------------------
def counts_as_failure(exit_event: dict) -> bool:
    """A non-zero exit that our stop did not cause."""
    return exit_event.get("returncode") != 0 and not exit_event.get("stopped")


def rank_failure(exit_event: dict) -> Failure:
    """The failure an exit event describes: its exception if it recorded one, else its output."""
    ev = exit_event
    rank, host = ev["rank"], ev.get("host", "?")
    how = (f"was killed by {ev['signal']}" if ev.get("signal")
           else f"exited with code {ev.get('returncode')}")
    err = ev.get("error")
    if err:
        headline = f"rank {rank} (host {host}) {how}: {err.get('exc_type')}: {err.get('message')}"
        return Failure(ev.get("time", time.time()), "rank", headline,
                       err.get("traceback_tail") or [], "traceback (last lines):", host, rank,
                       ev.get("signal"), _says_peer_lost(f"{err.get('exc_type')}: {err.get('message')}"))
    tail = ev.get("output_tail") or []
    return Failure(ev.get("time", time.time()), "rank", f"rank {rank} (host {host}) {how}",
                   tail, "last output lines:" if tail else "(it printed nothing)", host, rank,
                   ev.get("signal"))


# What gloo / NCCL / sockets say when the process at the other end of a connection died.
PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe",
             "connection refused", "remote process exited", "socket closed", "end of file")
# A killed rank's exit is stamped when its agent reaps it; a peer can fail on the broken
# connection a little earlier than that stamp. Within this window the killed rank is the cause.
PEER_WINDOW = 2.0


def _says_peer_lost(text: str) -> bool:
    low = text.lower()
    return any(p in low for p in PEER_LOST)


def root_cause(failures: list) -> Failure | None:
    """The earliest failure (the first recorded on a tie); None when there is none. Except: a
    rank that failed because a peer's connection went away is not the cause of a rank killed by
    a signal within ``PEER_WINDOW`` seconds after it (the kill's time is when it was reaped)."""
    if not failures:
        return None
    first = min(failures, key=lambda f: f.time)
    if first.peer_lost:
        killed = [f for f in failures if f.signal and 0 <= f.time - first.time <= PEER_WINDOW]
        if killed:
            return min(killed, key=lambda f: f.time)
    return first


def consequences(failures: list, root: Failure) -> list:
    """Every failure but the root, earliest first."""
    return sorted((f for f in failures if f is not root), key=lambda f: f.time)


def summary(root: Failure, failures: list, stopped: int) -> str:
    """The report: the root cause with its detail, then its consequences and the stopped ranks."""
    lines = [f"job failed: {root.text}"]
    if root.detail or root.detail_title:
        lines.append(f"  {root.detail_title}")
        lines += [f"    {line}" for line in root.detail]
    later = consequences(failures, root)
    if later:
        lines.append(f"  later failures (consequences): {len(later)}")
        lines += [f"    {f.text}" for f in later[:MAX_CONSEQUENCES_SHOWN]]
    if stopped:
        lines.append(f"  stopped {stopped} other rank(s)")
    return "\n".join(lines)
