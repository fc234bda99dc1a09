"""Between attempts: the controller's restart policy and its post-mortem records.

The controller reports what it sees (progress records from heartbeats, the failed attempt's root
cause and lost hosts); this decides the next attempt's plan (``elastic.py``'s rules), or stops
with the reason and exit code, and keeps one incident record per fault (``incidents.py``).
"""

from __future__ import annotations

import json
import time

from dslaunch.config import ConfigError, resolve_config
from dslaunch.launcher import incidents
from dslaunch.launcher.elastic import CRASH_LOOP_EXIT, NO_HOSTS_EXIT, AttemptProgress, ElasticPolicy, ElasticStop
from dslaunch.launcher.plan import WorldPlan, replan


class Recovery:
    def __init__(self, plan: WorldPlan, policy: ElasticPolicy | None, probe, say):
        self.policy = policy or ElasticPolicy.start(
            {n["host"]: n["slots"] for n in plan.nodes}, {}, len(plan.nodes), len(plan.nodes))
        self.probe, self.say = probe, say
        # Without --log-dir, only a job that may restart keeps records (in ./dslaunch-logs): a
        # plain failed run is reported on the terminal and leaves no files behind.
        keep = bool(plan.log_dir) or plan.max_restarts > 0
        self.log = incidents.IncidentLog(incidents.incidents_path(plan.log_dir) if keep else None)
        self.pending: incidents.Incident | None = None  # restarted, not training again yet
        self.restarted: float | None = None  # when its re-plan ended (the next attempt starts)
        # goodput (incidents.Goodput): the run's wall time, its ranks' step times (one sample
        # per rank and step), and the step the first attempt started from
        self.started = time.monotonic()
        self.step_times: list = []
        self.start_step: int | None = None
        self.begin()

    def begin(self) -> None:
        """A new attempt starts."""
        self.records: dict = {}  # rank -> its last progress record in this attempt
        self.current = AttemptProgress()
        self.heard: set = set()  # hosts whose agents were heard from as the attempt ended
        self.first_record: float | None = None  # when this attempt's ranks were first seen
        self.loaded_seen: float | None = None  # when a record first showed a loaded checkpoint
        self.sampled: dict = {}  # rank -> the step whose time was last sampled

    def on_progress(self, progress: dict) -> None:
        """A heartbeat's {rank: progress record}."""
        for rank, rec in progress.items():
            self.records[str(rank)] = rec
            self.current.update(rec)
            step, dt = rec.get("step", -1), rec.get("step_dt", 0.0)
            if dt and dt > 0 and step >= 0 and self.sampled.get(rank) != step:
                self.sampled[rank] = step
                if len(self.step_times) < 100_000:
                    self.step_times.append(dt)
        if self.start_step is None and self.current.step >= 0:  # the first records seen: the
            self.start_step = max(self.current.loaded, 0)  # first attempt's resume point
        now = time.time()
        if progress and self.first_record is None:
            self.first_record = now
        if self.current.loaded >= 0 and self.loaded_seen is None:
            self.loaded_seen = now
        if self.pending is not None and self.current.trained():
            self._close(time.time())

    def _close(self, trained_at: float | None) -> None:
        inc = self.pending
        if self.first_record is not None and self.restarted is not None:
            inc.restart_seconds = round(max(0.0, self.first_record - self.restarted), 3)
            if self.loaded_seen is not None:
                inc.load_seconds = round(self.loaded_seen - self.first_record, 3)
        inc.resumed(self.current.loaded, trained_at)
        self.log.write(self.pending)
        self.pending = None

    def after_failure(self, attempt: int, failure, lost: dict, plan: WorldPlan,
                      can_restart: bool, detected: float | None = None) -> WorldPlan | None:
        """The plan of the next attempt (None: no restart budget left, stop as failed). Raises
        ElasticStop (reason, exit code) when restarting is refused."""
        if self.pending is not None:
            self._close(None)  # failed again before training: resume point as far as known
        inc = self._incident(attempt, failure, max(self.current.step, self.current.saved),
                             plan.world_size)
        began = time.time()
        if detected is not None:
            inc.detect_seconds = round(max(0.0, detected - inc.time), 3)
            inc.stop_seconds = round(max(0.0, began - detected), 3)
        if not can_restart:
            inc.stop_reason, inc.exit_code = "no restart left (--max-restarts)", 1
            self.log.write(inc)
            return None
        policy = self.policy
        try:
            loop = policy.crash_loop(attempt, self.current)
            if loop:
                raise ElasticStop(CRASH_LOOP_EXIT, loop)
            before = list(policy.planned)
            for host, why in policy.exclude(attempt, lost, inc.culprit_host):
                inc.excluded_hosts[host] = why
                self.say(f"excluding host {host} from the next attempts: {why}")
            hosts, rejoined = policy.next_hosts(self._probe)
            new = plan if hosts == before else replan(plan, policy.selection())
            if new.world_size != plan.world_size:
                config_fits(new)
        except ElasticStop as stop:
            inc.stop_reason, inc.exit_code = stop.reason, stop.code
            self.log.write(inc)
            raise
        for host in rejoined:
            self.say(f"host {host} answers again: it rejoins the job")
        inc.rejoined_hosts = rejoined
        inc.action, inc.world_size_after = "restart", new.world_size
        self.restarted = time.time()
        inc.replan_seconds = round(self.restarted - began, 3)
        self.pending = inc
        return new

    def _incident(self, attempt: int, failure, last_step: int, world_size: int):
        """The record of a fault (``failure``: None when the attempt ended without one)."""
        return incidents.Incident(
            attempt=attempt, time=failure.time if failure else time.time(),
            detector=incidents.detector(failure.kind if failure else "agent"),
            kind=failure.kind if failure else "agent",
            reason=failure.text if failure else "failure",
            culprit_rank=getattr(failure, "rank", None), culprit_host=getattr(failure, "host", None),
            last_collective_seq=incidents.last_collectives(self.records),
            last_step=last_step, world_size_before=world_size)

    def in_process(self, attempt: int, failure, detected: float, step: int, world_size: int,
                   step_at_fault: int, *, abort: float, rebuild: float, state: float,
                   world_size_after: int | None = None) -> None:
        """An in-process recovery worked (launcher/inprocess.py): its incident record. The
        survivors kept their state, so no step is lost beyond the interrupted one's work.
        ``step_at_fault``: the furthest step the heartbeats showed when the recovery began (not
        now: the survivors that answered first may already be training on)."""
        if self.pending is not None:
            self._close(None)
        # the survivors' agreed step is the last completed one (a heartbeat may not have
        # reported it yet)
        inc = self._incident(attempt, failure, max(step_at_fault, step), world_size)
        inc.action, inc.world_size_after = "in-process", world_size_after or world_size
        inc.detect_seconds = round(max(0.0, detected - failure.time), 3)
        inc.stop_seconds, inc.restart_seconds, inc.load_seconds = abort, rebuild, state
        inc.resumed(step, time.time())
        self.log.write(inc)

    def _probe(self, hosts: list) -> set:
        """The hosts that answer: those heard from within the heartbeat timeout as the attempt
        ended answer (probing them again would only cost a connection each); the others are asked."""
        heard = {h for h in hosts if h in self.heard}
        ask = [h for h in hosts if h not in heard]
        return heard | (set(self.probe(ask)) if ask else set())

    def end(self, attempts: int, outcome: str, world_size: int) -> str:
        """The run is over: flush the last record; the summary paragraph ("" when no fault)."""
        if self.pending is not None:
            self._close(None)
        return incidents.summary(self.log.written, attempts, outcome, self.policy.history,
                                 world_size, self.log.path, self.goodput())

    def goodput(self) -> incidents.Goodput | None:
        """The run's goodput so far (None before any step time was reported)."""
        if not self.step_times or self.start_step is None or self.current.step < 0:
            return None
        times = sorted(self.step_times)
        return incidents.Goodput(steps=max(0, self.current.step - self.start_step),
                                 step_seconds=times[len(times) // 2],
                                 wall_seconds=time.monotonic() - self.started)


def config_fits(plan: WorldPlan) -> None:
    """Raise ElasticStop when the job's config cannot train at ``plan``'s world size (its batch
    triad, or an ``elasticity`` section ruling that size out): refused here, before any rank
    starts, rather than failing on every rank and ending as a crash loop."""
    if not plan.config:
        return
    try:
        resolve_config(json.loads(plan.config), world_size=plan.world_size,
                       origin=plan.config_path or "the job's config", autos="describe")
    except ConfigError as exc:
        raise ElasticStop(NO_HOSTS_EXIT, f"the hosts that answer give {plan.world_size} ranks, "
                          f"which the config cannot train with: {'; '.join(exc.lines())}") from None
