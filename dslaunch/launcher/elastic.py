"""Elastic restarts: which hosts the next attempt runs on, and when to stop restarting.

Pure logic (no processes): the controller asks, after a failed attempt, for the hosts of the next
one; ``probe`` (which hosts answer now) is handed in, so tests can drive every rule.

The rules, in the order they apply:

- A host is excluded when it is lost (no heartbeat, its agent or connection gone: the liveness
  detector) or when it is the culprit of two failed attempts in a row (``STRIKES``) and enough
  other hosts remain (else the failures are more likely the script's: see the crash loop). A lost host
  is probed again at every later restart and rejoins when it answers; a host excluded for its
  failing ranks stays out (it answers, so probing it says nothing).
- The next plan keeps the hosts of the last plan that still answer (in their order, so node ranks
  move as little as possible), then takes spares (hostfile ``spare``, and hosts beyond MAX), then
  excluded hosts that answer again, up to MAX hosts. Spares come first so the world size can stay
  the same without waiting for a flaky host.
- Refused (exit ``NO_HOSTS_EXIT``) when fewer than MIN hosts answer. Two halves of a split
  network never both train: only this controller starts ranks, and where its agents are fenced
  (``fencing``: the runner pings every agent, and an agent that hears nothing from the controller
  for the heartbeat timeout stops its own ranks; the controller starts the next attempt only after
  a lost host's agent has had that long) the half it cannot reach has stopped. So MIN, which the
  user wrote, decides: a 2-host job with ``--nnodes 1:2`` heals onto 1 host. Without fencing
  (pdsh, MPI, SLURM: no per-agent channel to ping) the old rule still guards the split: the hosts
  that answer must be a strict majority of the last plan's hosts plus the spares.
- A crash loop stops the job (exit ``CRASH_LOOP_EXIT``): ``CRASH_LOOP_LIMIT`` restarts in a row
  that made no progress, i.e. saved no checkpoint newer than any before and reached no step beyond
  the checkpoint they loaded (progress records; unknown fields are -1 and prove no progress).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Exit codes (docs/launcher.md). 75 is sysexits' EX_TEMPFAIL: the hosts may come back, a scheduler
# may requeue. A crash loop gets a code no rank failure gives (those exit 1): requeueing it would
# loop again, so a scheduler's policy can tell the two apart.
NO_HOSTS_EXIT = 75
CRASH_LOOP_EXIT = 3
STRIKES = 2  # failed attempts in a row with the same culprit host before that host is excluded
CRASH_LOOP_LIMIT = 3


class ElasticStop(Exception):
    """Restarting is refused: ``code`` is the launcher's exit code, the message says why."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


def parse_nnodes(text: str) -> tuple:
    """``"MIN:MAX"`` or ``"N"`` (= N:N), as torchrun spells ``--nnodes``; ValueError names the flag."""
    parts = str(text).split(":")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        elif len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"--nnodes {text!r}: expected N or MIN:MAX (e.g. 2:4)") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return lo, hi


@dataclass
class AttemptProgress:
    """What the progress records showed during one attempt (max over ranks; -1: never seen)."""

    step: int = -1
    saved: int = -1
    loaded: int = -1

    def update(self, record: dict) -> None:
        self.step = max(self.step, int(record.get("step", -1)))
        self.saved = max(self.saved, int(record.get("ckpt_saved_step", -1)))
        self.loaded = max(self.loaded, int(record.get("ckpt_loaded_step", -1)))

    def trained(self) -> bool:
        """Whether a step beyond the loaded checkpoint was reached (training is going again)."""
        return self.step >= 0 and self.step > self.loaded


@dataclass
class ElasticPolicy:
    hosts: dict  # every host the job may use -> slot ids, hostfile order
    planned: list  # the hosts of the current plan, in node order
    min_nodes: int
    max_nodes: int
    spares: list = field(default_factory=list)  # hosts not planned at first, hostfile order
    excluded: dict = field(default_factory=dict)  # host -> why (out of the next plans)
    history: list = field(default_factory=list)  # (attempt, host, why): every exclusion, in order
    sticky: set = field(default_factory=set)  # excluded for failing ranks: never probed back
    last_culprit: str | None = None
    culprit_streak: int = 0
    best_saved: int = -1
    idle_restarts: int = 0  # restarts in a row without progress
    fencing: bool = False  # agents stop their ranks when cut off (then no majority rule)

    @classmethod
    def start(cls, selection: dict, spares: dict, min_nodes: int, max_nodes: int) -> "ElasticPolicy":
        """The first plan: ``selection``'s first MAX hosts; the rest and ``spares`` wait."""
        names = list(selection)
        planned, standby = names[:max_nodes], names[max_nodes:]
        if len(planned) < min_nodes:
            raise ElasticStop(NO_HOSTS_EXIT, f"only {len(planned)} host(s) selected "
                              f"({', '.join(planned)}), fewer than the minimum {min_nodes} of --nnodes")
        hosts = {**selection, **spares}
        return cls(hosts=hosts, planned=planned, min_nodes=min_nodes, max_nodes=max_nodes,
                   spares=[h for h in hosts if h in standby or h in spares])

    def selection(self) -> dict:
        return {h: self.hosts[h] for h in self.planned}

    # ---- after a failed attempt ----------------------------------------------------------------
    def exclude(self, attempt: int, lost: dict, culprit: str | None) -> list:
        """Record this attempt's exclusions: ``lost`` {host: why} (liveness), and ``culprit``, the
        root cause's host, excluded at its STRIKES-th failed attempt in a row. Returns the
        (host, why) pairs newly excluded."""
        new = [(h, why) for h, why in lost.items() if h in self.hosts]
        if culprit in lost or culprit not in self.hosts:
            self.last_culprit, self.culprit_streak = None, 0
        elif culprit == self.last_culprit:
            self.culprit_streak += 1
        else:
            self.last_culprit, self.culprit_streak = culprit, 1
        others = [h for h in self.planned + self.spares if h != culprit and h not in self.excluded
                  and h not in lost]
        # Excluded only when the job can go on without it: on a single host, or with no host to
        # spare, repeated failures more likely come from the script (the crash-loop rule's case).
        if self.last_culprit and self.culprit_streak >= STRIKES and len(others) >= self.min_nodes:
            new.append((culprit, f"its ranks failed in {self.culprit_streak} attempts in a row"))
            self.sticky.add(culprit)
            self.last_culprit, self.culprit_streak = None, 0
        for h, why in new:
            self.excluded[h] = why
            self.history.append((attempt, h, why))
        return new

    def crash_loop(self, attempt: int, progress: AttemptProgress) -> str | None:
        """After failed attempt ``attempt``: the reason to stop when restarts make no progress."""
        moved = progress.saved > self.best_saved or progress.trained()
        self.best_saved = max(self.best_saved, progress.saved)
        if attempt == 0:
            return None  # only restarts count: the first attempt may fail for any reason
        self.idle_restarts = 0 if moved else self.idle_restarts + 1
        if self.idle_restarts < CRASH_LOOP_LIMIT:
            return None
        saved = f"step {self.best_saved}" if self.best_saved >= 0 else "none"
        return (f"crash loop: {self.idle_restarts} restarts in a row made no progress (no newer "
                f"checkpoint, no step beyond the one loaded; last checkpoint saved: {saved})")

    def next_hosts(self, probe) -> tuple:
        """The hosts of the next attempt and the hosts that rejoined; ``probe(hosts) -> set`` of
        those that answer now. Raises ElasticStop when too few answer or no majority does."""
        keep = [h for h in self.planned if h not in self.excluded]
        back = [h for h in self.excluded if h not in self.sticky and h not in self.planned]
        others = [h for h in self.spares if h not in self.excluded]
        ask = keep + others + back
        answering = probe(ask) if ask else set()
        keep = [h for h in keep if h in answering]
        chosen = list(keep)
        for h in others + back:
            if len(chosen) >= self.max_nodes:
                break
            if h in answering:
                chosen.append(h)
        if len(chosen) < self.min_nodes:
            gone = ", ".join(f"{h} ({why})" for h, why in self.excluded.items()) or "none"
            silent = [h for h in ask if h not in answering]
            raise ElasticStop(NO_HOSTS_EXIT, (
                f"only {len(chosen)} host(s) can run the job ({', '.join(chosen) or 'none'}), "
                f"fewer than the minimum {self.min_nodes} of --nnodes; excluded: {gone}"
                + (f"; not answering: {', '.join(silent)}" if silent else "")))
        base = set(self.planned) | set(self.spares)
        reached = len([h for h in base if h in answering and h not in self.excluded])
        if not self.fencing and 2 * reached <= len(base):
            raise ElasticStop(NO_HOSTS_EXIT, (
                f"no majority: {reached} of the {len(base)} hosts of the last plan and its "
                f"spares answer ({', '.join(sorted(base))}); going on could leave two halves of "
                "a split network training (this launcher cannot fence its agents)"))
        rejoined = [h for h in chosen if h in back]
        for h in rejoined:
            del self.excluded[h]
        self.spares = [h for h in self.hosts if h not in chosen and h not in self.excluded]
        self.planned = chosen
        return chosen, rejoined
