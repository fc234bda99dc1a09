"""Faults on demand (``dslaunch run --inject SPEC``): what ops teams use to rehearse a job's
failures. Off unless asked for.

SPEC is ``KIND:key=value,...``:

- ``kill:rank=R``: the rank SIGKILLs itself;
- ``hang:rank=R``: the rank blocks forever in ``_injected_hang``, outside any collective;
- ``slow:rank=R,seconds=S``: the rank sleeps S seconds at every step from then on;
- ``host-down:host=H``: H's agent SIGKILLs its ranks, then goes silent (no heartbeat, no output,
  commands ignored) until the launcher drops its connection: a power loss as the launcher sees it;
- ``link-down:host=H``: H's agent takes its network interface down (only as root inside a
  network namespace: the fake hosts of tests/infra; anywhere else it says so and does nothing).

Every kind takes one trigger, ``step=N`` (the engine's global step reached N; a plain torch
script reports it with ``dslaunch.inject.tick(step)``) or ``after=SECONDS`` (``30``, ``30s``,
``2m``: since the rank or the agent started), and ``attempt=N|all`` (default 0: a restarted job
must not meet the same fault forever). Host faults with ``step=`` read the ranks' progress records.

Rank faults also take ``at=SECONDS``: seconds since the job started (the launcher stamps its start,
``t0``, into the fault), once per job: the first process of the rank that makes a step at or after
that time fires it, whichever attempt or replacement it is, and no later process of the rank meets
it again (the firing process claims a marker file named by ``once`` in the host's temporary
directory first; the launcher removes its host's markers at the end). A schedule of ``at=`` faults
is one fault at a time across the whole job, the way a job meets faults in production, where
``after=`` counts from each process's own start. Hosts' clocks are assumed to agree (NTP).

The launcher validates the specs here and ships them to every rank and agent as JSON in
``DSLAUNCH_INJECT``; the rank side is ``engine/base/fault_injection.py`` (the engine may not import the
launcher), the agent side is ``HostFaults`` below.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import uuid

from dslaunch import progress_record

ENV = "DSLAUNCH_INJECT"
RANK_KINDS = ("kill", "hang", "slow")
HOST_KINDS = ("host-down", "link-down")
KINDS = RANK_KINDS + HOST_KINDS
SILENT_CAP = 900.0  # a silenced agent whose connection never closes still ends after this long
POLL = 0.1
ONCE_PREFIX = "dslaunch-inject-"  # + job token + index: the marker engine/base/fault_injection.py claims


class InjectError(ValueError):
    """A bad ``--inject`` spec; the message names the spec and the bad part."""


def _seconds(spec: str, key: str, text: str) -> float:
    scale = 1.0
    body = text
    if text.endswith("ms"):
        body, scale = text[:-2], 0.001
    elif text[-1:] in ("s", "m", "h"):
        body, scale = text[:-1], {"s": 1.0, "m": 60.0, "h": 3600.0}[text[-1]]
    try:
        value = float(body) * scale
    except ValueError:
        raise InjectError(f"--inject {spec!r}: {key}={text!r} is not a duration "
                          "(seconds, or with s/m/h/ms: 30, 30s, 2m)") from None
    if value < 0 or value != value:
        raise InjectError(f"--inject {spec!r}: {key}={text!r} must be >= 0")
    return value


def _int(spec: str, key: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InjectError(f"--inject {spec!r}: {key}={text!r} is not a whole number") from None
    if value < 0:
        raise InjectError(f"--inject {spec!r}: {key}={text!r} must be >= 0")
    return value


def parse_spec(spec: str) -> dict:
    """One SPEC -> {"kind", "rank"|"host", "step"|"after", "attempt", ["seconds"], "spec"}."""
    kind, colon, rest = spec.strip().partition(":")
    if kind not in KINDS:
        raise InjectError(f"--inject {spec!r}: unknown fault {kind!r} (one of {', '.join(KINDS)})")
    target = "rank" if kind in RANK_KINDS else "host"
    allowed = {target, "step", "after", "attempt"} | ({"seconds"} if kind == "slow" else set()) \
        | ({"at"} if target == "rank" else set())
    fault: dict = {"kind": kind, "spec": spec.strip(), "attempt": 0}
    seen: set = set()
    for part in filter(None, (p.strip() for p in rest.split(","))) if colon else ():
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise InjectError(f"--inject {spec!r}: {part!r} is not key=value")
        if key not in allowed:
            raise InjectError(f"--inject {spec!r}: {kind} takes no {key!r} (it takes "
                              f"{', '.join(sorted(allowed))})")
        if key in seen:
            raise InjectError(f"--inject {spec!r}: {key} given twice")
        seen.add(key)
        if key == "host":
            fault["host"] = value
        elif key in ("rank", "step"):
            fault[key] = _int(spec, key, value)
        elif key in ("after", "seconds", "at"):
            fault[key] = _seconds(spec, key, value)
        else:  # attempt
            fault["attempt"] = "all" if value == "all" else _int(spec, key, value)
    if target not in fault:
        raise InjectError(f"--inject {spec!r}: {kind} needs {target}= (e.g. "
                          f"{kind}:{target}={'1' if target == 'rank' else 'host2'},step=10)")
    if sum(key in fault for key in ("step", "after", "at")) != 1:
        raise InjectError(f"--inject {spec!r}: give exactly one trigger, step=N or after=SECONDS"
                          + (" or at=SECONDS" if target == "rank" else ""))
    if "at" in fault:
        if "attempt" in seen:
            raise InjectError(f"--inject {spec!r}: at= fires once per job, in whichever attempt "
                              "runs then: it takes no attempt=")
        fault["attempt"] = "all"
    if kind == "slow" and not fault.get("seconds"):
        raise InjectError(f"--inject {spec!r}: slow needs seconds=S > 0 (the sleep per step)")
    return fault


def parse_specs(specs, hosts: list, world_size: int) -> list:
    """Every spec parsed and checked against the job (its hosts and world size)."""
    faults = []
    for spec in specs:
        fault = parse_spec(spec)
        if "rank" in fault and fault["rank"] >= world_size:
            raise InjectError(f"--inject {spec!r}: rank={fault['rank']} is not in this job "
                              f"(world size {world_size})")
        if "host" in fault and fault["host"] not in hosts:
            raise InjectError(f"--inject {spec!r}: host={fault['host']} is not in this job "
                              f"(hosts: {', '.join(hosts)})")
        faults.append(fault)
    return faults


def encode(faults: list, job_start: float | None = None) -> str:
    """The faults as the ranks and agents get them; ``at=`` faults stamped with the job's start
    (``job_start``, default now) and their once-per-job marker's name."""
    token = uuid.uuid4().hex[:12]
    t0 = time.time() if job_start is None else job_start
    out = [{**f, "t0": t0, "once": f"{ONCE_PREFIX}{token}-{i}"} if "at" in f else f
           for i, f in enumerate(faults)]
    return json.dumps(out, separators=(",", ":"))


def forget(encoded: str) -> int:
    """Remove this host's once-per-job markers of ``encoded``'s ``at=`` faults (the job is over).
    Returns how many were there."""
    n = 0
    for fault in decode(encoded):
        name = fault.get("once")
        if not isinstance(name, str) or not name.startswith(ONCE_PREFIX) or "/" in name:
            continue
        try:
            os.unlink(os.path.join(tempfile.gettempdir(), name))
            n += 1
        except OSError:
            pass
    return n


def decode(text: str | None) -> list:
    if not text:
        return []
    try:
        faults = json.loads(text)
    except ValueError:
        return []
    return [f for f in faults if isinstance(f, dict)] if isinstance(faults, list) else []


def applies(fault: dict, attempt: int) -> bool:
    return fault.get("attempt", 0) in ("all", attempt)


# ---- the agent's side ----------------------------------------------------------------------------
def _in_own_netns() -> bool:
    """True only inside a named network namespace (``ip netns add``, as tests/infra makes them),
    never in the machine's own: downing a link there cannot cut this machine off."""
    try:
        if os.stat("/proc/self/ns/net").st_ino == os.stat("/proc/1/ns/net").st_ino:
            return False
    except OSError:
        pass  # PID 1's namespace is not readable from an ssh session: the name below decides
    try:
        out = subprocess.run(["ip", "netns", "identify", str(os.getpid())], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def _uplink() -> str | None:
    """The interface this host reaches the others through: the default route's, else the first
    non-loopback interface that is up."""
    try:
        out = subprocess.run(["ip", "-o", "route", "show", "default"], capture_output=True,
                             text=True, timeout=5).stdout.split()
        if "dev" in out:
            return out[out.index("dev") + 1]
        out = subprocess.run(["ip", "-o", "link", "show", "up"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if name and name != "lo":
            return name
    return None


class HostFaults:
    """Runs this host's faults for an agent (``agent.py`` starts it after its ranks). The agent
    provides ``host``, ``restart_count``, ``ranks``, ``progress_file(rank)``, ``kill_ranks()``,
    ``silence()`` and ``say(text)`` (to its stderr)."""

    def __init__(self, agent, faults: list):
        self.agent = agent
        self.faults = [f for f in faults if f["kind"] in HOST_KINDS and f.get("host") == agent.host
                       and applies(f, agent.restart_count)]
        self.t0 = time.monotonic()

    @classmethod
    def from_env(cls, agent, env) -> "HostFaults | None":
        faults = cls(agent, decode(env.get(ENV)))
        return faults if faults.faults else None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _due(self, fault: dict) -> bool:
        if "after" in fault:
            return time.monotonic() - self.t0 >= fault["after"]
        # the records themselves, not the agent's view of them (the watchdog keeps state there)
        steps = [rec["step"] for rec in (progress_record.read(self.agent.progress_file(r.rank))
                                         for r in self.agent.ranks) if rec is not None]
        return bool(steps) and max(steps) >= fault["step"]

    def _run(self) -> None:
        pending = list(self.faults)
        while pending:
            for fault in [f for f in pending if self._due(f)]:
                pending.remove(fault)
                self.fire(fault)
            time.sleep(POLL)

    def fire(self, fault: dict) -> None:
        if fault["kind"] == "host-down":
            self.agent.say(f"inject {fault['spec']}: killing this host's ranks and going silent")
            self.agent.silence()
            self.agent.kill_ranks()
        else:
            self.link_down(fault)

    def link_down(self, fault: dict) -> None:
        if os.geteuid() != 0 or not _in_own_netns():
            self.agent.say(f"inject {fault['spec']}: skipped: link-down runs only as root inside "
                           "a network namespace (the fake hosts of tests/infra)")
            return
        dev = _uplink()
        if dev is None:
            self.agent.say(f"inject {fault['spec']}: skipped: no network interface found")
            return
        self.agent.say(f"inject {fault['spec']}: taking {dev} down")
        subprocess.run(["ip", "link", "set", dev, "down"], capture_output=True, timeout=10)


__all__ = ["ENV", "InjectError", "parse_spec", "parse_specs", "encode", "decode", "forget",
           "applies", "HostFaults"]
