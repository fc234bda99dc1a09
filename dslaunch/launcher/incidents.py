"""Post-mortem records: one JSON line per fault the launcher handled, and the run's summary.

Where: ``<log_dir>/incidents.jsonl`` with ``--log-dir``, else, for a job that may restart
(``--max-restarts``), ``./dslaunch-logs/incidents.jsonl`` (the launcher's working directory);
created at the first incident only: a run without faults writes nothing, nor does a failed run
with neither option (its report is on the terminal). One line per incident, appended when it is
complete: when the attempt after it trains again (its resume point and time to recover are known
then), or when the run ends.

Fields (None where unknown; progress fields come from the ranks' progress records, so a script
that does not use the engine leaves them unknown):

- ``attempt``: the attempt that failed (0 = the first); ``time``: the first fault (epoch seconds);
- ``detector``: ``liveness`` (no heartbeat, agent or connection gone), ``progress`` (a hang or a
  desync) or ``exit`` (a rank exited non-zero); ``kind``: the failure's own kind;
- ``culprit_rank``, ``culprit_host``, ``reason``: the root cause (errors.py's rule);
- ``last_collective_seq``: {rank: the sequence number of the last collective it entered};
- ``last_step``: the highest step reached before the fault;
- ``action``: ``restart`` or ``stop``; ``stop_reason`` and ``exit_code`` when it stopped;
- ``excluded_hosts``: {host: why} newly excluded at this fault; ``rejoined_hosts``: hosts back;
- ``world_size_before``, ``world_size_after``;
- ``detect_seconds``: from the first fault to the launcher noticing it; ``stop_seconds``: from
  then to every rank of the attempt stopped; ``replan_seconds``: choosing the next hosts
  (probing them) and planning; ``restart_seconds``: from the end of the re-plan to the first
  progress record of the next attempt's ranks; ``load_seconds``: from then to the first record
  showing the checkpoint loaded (both seen through heartbeats: about a second of resolution;
  None when not seen);
- ``resumed_from``: the checkpoint step the next attempt loaded (-1: it started fresh);
- ``steps_redone``: ``last_step - resumed_from``; ``seconds_to_training``: from the fault to the
  first step of the next attempt beyond the checkpoint it loaded.

The run's summary (``summary``) ends with one line per fault (``breakdown``: steps lost, and the
time back to training as detect + abort + re-plan + rebuild + state transfer + the first step)
and the run's goodput (``Goodput``: productive step time over wall time).

No torch, nothing of the engine: pure data and file writing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

FILE = "incidents.jsonl"
DEFAULT_DIR = "dslaunch-logs"
DETECTORS = {"lost": "liveness", "agent": "liveness", "rank": "exit"}  # any other kind: progress


def detector(kind: str) -> str:
    return DETECTORS.get(kind, "progress")


def incidents_path(log_dir: str | None) -> str:
    return os.path.join(log_dir or os.path.abspath(DEFAULT_DIR), FILE)


@dataclass
class Incident:
    attempt: int
    time: float
    detector: str
    kind: str
    reason: str
    culprit_rank: int | None = None
    culprit_host: str | None = None
    last_collective_seq: dict = field(default_factory=dict)
    last_step: int | None = None
    action: str = "stop"
    stop_reason: str | None = None
    exit_code: int | None = None
    excluded_hosts: dict = field(default_factory=dict)
    rejoined_hosts: list = field(default_factory=list)
    world_size_before: int | None = None
    world_size_after: int | None = None
    resumed_from: int | None = None
    steps_redone: int | None = None
    seconds_to_training: float | None = None
    detect_seconds: float | None = None
    stop_seconds: float | None = None
    replan_seconds: float | None = None
    restart_seconds: float | None = None
    load_seconds: float | None = None

    def resumed(self, loaded: int, trained_at: float | None) -> None:
        """The next attempt loaded checkpoint step ``loaded`` (-1: none) and trained again at
        ``trained_at`` (epoch seconds; None: not yet seen)."""
        self.resumed_from = loaded
        if self.last_step is not None and self.last_step >= 0:
            # (a checkpoint newer than the last heartbeat's step may have been loaded: 0 then)
            self.steps_redone = max(0, self.last_step - max(loaded, 0))
        if trained_at is not None:
            self.seconds_to_training = round(trained_at - self.time, 3)


# the phases of a recovery, in order: (label, field)
PHASES = (("detect", "detect_seconds"), ("abort", "stop_seconds"), ("re-plan", "replan_seconds"),
          ("rebuild", "restart_seconds"), ("state transfer", "load_seconds"))


def breakdown(inc: Incident) -> str:
    """One fault's cost: steps lost, and the seconds from the fault to training again split into
    detect / abort (stopping the attempt) / re-plan / rebuild (new ranks up to their first
    record) / state transfer (the checkpoint loaded), the rest being the first step after it."""
    parts = [f"{label} {getattr(inc, name):.1f}" for label, name in PHASES
             if getattr(inc, name) is not None]
    text = f"{inc.steps_redone} step(s) lost" if inc.steps_redone is not None else ""
    if inc.seconds_to_training is not None:
        known = sum(getattr(inc, name) or 0.0 for _, name in PHASES)
        rest = inc.seconds_to_training - known
        if rest >= 0.05:
            parts.append(f"first step {rest:.1f}")
        text += (", " if text else "") + f"training again after {inc.seconds_to_training:.1f} s"
        if parts:
            text += " = " + " + ".join(parts)
    elif parts:
        text += (", " if text else "") + " + ".join(parts) + " s"
    return text


@dataclass
class Goodput:
    """Productive step time over wall time: the steps the job kept (its last step minus the one
    it started from) times the median step time its ranks reported, over the launcher's wall
    time from start to end. Start-up, faults, recoveries and redone steps are what it loses."""

    steps: int
    step_seconds: float
    wall_seconds: float

    @property
    def value(self) -> float:
        return min(1.0, self.steps * self.step_seconds / self.wall_seconds) \
            if self.wall_seconds > 0 else 0.0

    def text(self) -> str:
        return (f"goodput {self.value:.2f}: {self.steps} step(s) kept x {self.step_seconds:.3f} s "
                f"(median step time) over {self.wall_seconds:.1f} s of wall time")


def last_collectives(progress: dict) -> dict:
    """{rank: last collective sequence number} from {rank: progress record}: the one it is in,
    else the last it completed."""
    out = {}
    for rank, rec in progress.items():
        seq = rec.get("coll_seq") or rec.get("last_seq") or 0
        out[str(rank)] = int(seq)
    return out


class IncidentLog:
    """Appends records to ``path`` (directory made on the first write); None: keeps them in
    memory only (``written``, for the summary)."""

    def __init__(self, path: str | None):
        self.path = path
        self.written: list = []

    def write(self, incident: Incident) -> None:
        self.written.append(incident)
        if self.path is None:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(dataclasses.asdict(incident), sort_keys=True) + "\n")


def read(path: str) -> list:
    """Every record in ``path`` (dicts), oldest first; [] when there is none."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def summary(incidents: list, attempts: int, outcome: str, exclusions: list, world_size: int,
            path: str | None, goodput=None) -> str:
    """One paragraph: what happened to the run, for the end of the launcher's output; then one
    line per fault (``breakdown``) and the job's goodput (a ``Goodput``, when known)."""
    if not incidents:
        return ""
    kinds = ", ".join(f"{i.detector} ({i.reason})" for i in incidents[:3])
    if len(incidents) > 3:
        kinds += f", and {len(incidents) - 3} more"
    text = (f"run summary: {len(incidents)} fault(s) handled in {attempts} attempt(s): {kinds}. ")
    if exclusions:
        text += "Excluded hosts: " + "; ".join(f"{h} at attempt {a} ({why})"
                                               for a, h, why in exclusions) + ". "
    else:
        text += "No host was excluded. "
    recovered = [i.seconds_to_training for i in incidents if i.seconds_to_training is not None]
    if recovered:
        text += f"Training again after {', '.join(f'{s:.1f}' for s in recovered)} s. "
    redone = [i.steps_redone for i in incidents if i.steps_redone is not None]
    if redone:
        text += f"Steps redone: {', '.join(map(str, redone))}. "
    text += f"Final world size {world_size}; {outcome}."
    if path:
        text += f" Records: {path}"
    for n, inc in enumerate(incidents, 1):
        line = breakdown(inc)
        if line:
            text += f"\nfault {n}: {line}"
    if goodput is not None:
        text += f"\n{goodput.text()}"
    return text
