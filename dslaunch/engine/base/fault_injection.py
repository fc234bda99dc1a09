"""A rank's side of ``dslaunch run --inject`` (the kinds and the spec: launcher/inject.py).

The launcher ships the validated faults as JSON in ``DSLAUNCH_INJECT``; this rank keeps those that
name it and the current attempt (``DSLAUNCH_RESTART_COUNT``). The engine calls ``at_step`` once per
optimizer step; a plain torch script calls ``dslaunch.inject.tick(step)``. Without the variable
``from_env`` is None and the engine's check is one attribute test per step.

Each fault says what it does on stdout first (flushed), so the job's log shows the cause.

``at=`` faults are on the job's clock (``t0``, the launcher's start, + ``at``) and fire once per
job: before firing, the process claims the fault's marker file (``once``, in this host's temporary
directory, created exclusively); a later process of the rank (a restart, an in-process
replacement) finds it taken and drops the fault.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

from dslaunch import progress_record

ENV = "DSLAUNCH_INJECT"


def _age() -> float:
    """Seconds since this process started (Linux's /proc), else 0: "after=" counts from there,
    not from when the script got round to importing the engine."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


_T0 = time.monotonic() - _age()


def restart_clock() -> None:
    """A promoted standby's life starts now ("after=" counts from its promotion)."""
    global _T0
    _T0 = time.monotonic()


def _injected_hang(announce: str) -> None:
    """Blocks forever outside any collective: the name is what a stack dump shows. The
    announcement is written from inside, so whoever reads it and dumps the stack finds this frame."""
    _say(announce)
    while True:
        time.sleep(3600)


def _say(text: str) -> None:
    sys.stdout.write(f"dslaunch inject: {text}\n")
    sys.stdout.flush()


class RankFaults:
    def __init__(self, faults: list, rank: int):
        self.rank = rank
        self.pending = faults
        self.slow = 0.0  # seconds slept per step once a slow fault fired
        self.slept_steps = 0

    @classmethod
    def from_env(cls, env=None) -> "RankFaults | None":
        env = os.environ if env is None else env
        text = env.get(ENV)
        if not text:
            return None
        try:
            faults = json.loads(text)
            rank = int(env.get("RANK", "0"))
            attempt = int(env.get("DSLAUNCH_RESTART_COUNT", env.get("TORCHELASTIC_RESTART_COUNT", "0")))
        except ValueError:
            return None
        mine = [f for f in faults if isinstance(f, dict) and f.get("rank") == rank
                and f.get("kind") in ("kill", "hang", "slow") and f.get("attempt", 0) in ("all", attempt)]
        return cls(mine, rank) if mine else None

    def at_step(self, step: int) -> None:
        """The global step counter reached ``step``: fire what is due."""
        if self.pending:
            elapsed, now = time.monotonic() - _T0, time.time()
            for fault in [f for f in self.pending if f.get("step", -1) <= step and "step" in f
                          or "after" in f and elapsed >= f["after"]
                          or "at" in f and now >= f.get("t0", 0.0) + f["at"]]:
                self.pending.remove(fault)
                if "at" in fault and not claim_once(fault):
                    continue  # an earlier process of this job fired it
                self._fire(fault, step)
        if self.slow:
            self.slept_steps += 1
            time.sleep(self.slow)

    def _fire(self, fault: dict, step: int) -> None:
        kind, spec = fault["kind"], fault.get("spec", fault["kind"])
        if kind == "kill":
            _say(f"{spec}: rank {self.rank} (pid {os.getpid()}) kills itself (SIGKILL) at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            _injected_hang(f"{spec}: rank {self.rank} (pid {os.getpid()}) hangs in _injected_hang at step {step}")
        else:
            self.slow = float(fault["seconds"])
            _say(f"{spec}: rank {self.rank} sleeps {self.slow:g} s at every step from step {step}")


def claim_once(fault: dict) -> bool:
    """True for the first process of the job to claim ``fault`` (its marker file did not exist),
    False for any later one. A fault without a usable marker name is claimed (it fires)."""
    name = fault.get("once")
    if not isinstance(name, str) or not name or "/" in name:
        return True
    try:
        os.close(os.open(os.path.join(tempfile.gettempdir(), name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


_FAULTS: RankFaults | None = None
_PROGRESS: progress_record.ProgressWriter | None = None
_LOADED = False


def tick(step: int) -> None:
    """For a script without the engine: call once per training step with its step number. Also
    reports the step in the progress record (what host faults with step=, and the launcher's
    progress checks, read), as the engine does for its own steps."""
    global _FAULTS, _PROGRESS, _LOADED
    if not _LOADED:
        _FAULTS, _PROGRESS, _LOADED = RankFaults.from_env(), progress_record.writer(), True
    if _PROGRESS is not None:
        _PROGRESS.step(step)
    if _FAULTS is not None:
        _FAULTS.at_step(step)
