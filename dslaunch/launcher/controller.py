"""The job controller, shared by every runner: start the agents, show their ranks' output, watch
their events, fail fast, report.

- Every failure is recorded; the summary names the root cause by the rule in ``errors.py``.
- A node whose agent sends nothing for ``heartbeat_timeout`` seconds is declared lost, by host.
- Ctrl-C / SIGTERM: the first stops every rank gracefully, the second kills them.
- ``max_restarts``: after a failure the whole job starts again, the budget counted across the job,
  on the hosts ``recovery.py`` chooses (lost ones excluded, spares taken in, ``--nnodes MIN:MAX``),
  with one incident record per fault (``incidents.py``).
- ``hang_timeout`` (> 0): the hang watchdog (``watchdog.py``) reads the ranks' progress from the
  heartbeats; its verdict (hang, desync) is a failure like any other, reported with the stacks.
- The live job view (``jobview.py``) reads the same heartbeats: a table with ``monitor``
  (``live_table.py``), ``DIR/status.json`` with a log dir (what ``dslaunch top`` reads), and the
  straggler report (``stragglers.py``) at the end with ``monitor``, or on SIGUSR1 at any time.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from dslaunch.launcher import errors, events, jobview, stragglers, watchdog
from dslaunch.launcher.elastic import ElasticStop
from dslaunch.launcher.errors import Failure
from dslaunch.launcher.inprocess import InProcessRecovery
from dslaunch.launcher.plan import WorldPlan
from dslaunch.launcher.recovery import Recovery

TAIL_LINES = 20
HEARTBEAT_TIMEOUT = 5.0  # default: agents beat every second, so 5 missed beats; a loss seen in <= 6 s
# Before a node's agent is first heard from, its fan-out may still be starting it: mpirun waits
# for its security plugin (munge: seconds when munged is down), srun for the allocation, ssh for
# a loaded host. The heartbeat timeout applies from the first sign of life; until then this one.
START_TIMEOUT = 30.0
SSH_DROPPED = 255  # ssh's exit code when the connection failed or dropped
STALL = 0.5  # a write to our stdout this long means our output, not the agent, held its events
POLL = 0.1  # main-loop tick: signal flags and heartbeat deadlines are checked this often
KILL_SLACK = 10.0  # after a stop, agents get grace_period + this long before being killed
PIPE_SLACK = 3.0  # after that kill, an exited agent's pipes get this long to reach EOF


@dataclass
class AgentProcess:
    """One started agent process; ``node_ranks`` are the nodes whose events it carries."""

    argv: list
    node_ranks: list
    label: str
    popen_kwargs: dict = field(default_factory=dict)
    output_demux: object = None  # see _whole_lines
    proc: subprocess.Popen | None = None
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    finished: bool = False
    pids: dict = field(default_factory=dict)  # rank -> pid, from the agents' started events
    # Liveness seen by the stdout reader (the heartbeats travel in-band with the ranks' output):
    last_line: float = 0.0  # when it last read a line (any line: the agent is alive)
    writing_since: float | None = None  # it is writing a rank's line to our stdout since then
    resumed_at: float = 0.0  # when a write blocked for STALL s or more ended
    warm_host: str | None = None  # a warm spare's host, until it adopts a lost host's node


def _whole_lines(stream, demux, name: str):
    """The lines of an agent process's ``stream`` as its nodes wrote them: through ``demux``
    (runners/mpi.py ``TaggedStream``) where the runtime mixes several nodes' chunks."""
    if demux is None:
        yield from stream
        return
    lines = demux(name)
    for raw in stream:
        yield from lines.feed(raw)
    yield from lines.rest()


def _all_answer(hosts) -> set:
    return set(hosts)


class JobController:
    def __init__(self, plan: WorldPlan, runner, *, heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
                 hang_timeout: float = 0.0, out=None, err=None, elastic=None, monitor: bool = False,
                 straggler_threshold: float = stragglers.DEFAULT_THRESHOLD):
        self.plan, self.runner = plan, runner
        self.heartbeat_timeout = heartbeat_timeout
        self.hang_timeout = hang_timeout
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.out_lock = threading.Lock()
        self.prefixes = plan.prefixes()
        self.logs: dict = {}
        self.interrupts = 0
        self.interrupt_name = ""
        self.recovery = Recovery(plan, elastic, getattr(runner, "probe", _all_answer), self._say)
        self.recovery.policy.fencing = plan.fence_timeout > 0
        self.fenced_by: float | None = None  # a cut-off agent has stopped its ranks by then
        self.in_process = InProcessRecovery(self)  # --recover in-process (inprocess.py)
        self.straggler_threshold = straggler_threshold
        self.report_requested = False  # SIGUSR1: print the straggler report now
        self.monitor = None
        if monitor:
            from dslaunch.launcher.live_table import Monitor  # rich: only when asked for

            self.monitor = Monitor(self.out)

    # ---- public --------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job (with restarts); the launcher's exit code."""
        for notice in self.runner.notices():
            self._say(notice)
        restore = self._install_signals()
        attempt, outcome = 0, "interrupted"
        try:
            while True:
                code, failure = self._run_once(attempt)
                if code == 0 or self.interrupts:
                    outcome = "finished" if code == 0 else outcome
                    return code
                last = attempt + self.in_process.done >= self.plan.max_restarts
                outcome = "failed (no restart left)"
                try:
                    plan = self.recovery.after_failure(attempt, failure, self.lost_hosts, self.plan,
                                                       can_restart=not last, detected=self.detected)
                except ElasticStop as stop:
                    outcome = f"stopped: {stop.reason}"
                    self._say(f"not restarting: {stop.reason} (exit code {stop.code})")
                    return stop.code
                if plan is None:
                    return code
                self._await_fencing()
                if self.interrupts:  # Ctrl-C while the next hosts were probed: start nothing
                    outcome = "interrupted"
                    return 130 if self.interrupt_name == "SIGINT" else 143
                attempt += 1
                moved = ""
                if plan is not self.plan:
                    moved = (f" on {', '.join(n['host'] for n in plan.nodes)} (world size "
                             f"{self.plan.world_size} -> {plan.world_size})")
                    self._use_plan(plan)
                self._say(f"restarting the whole job (restart {attempt} of {self.plan.max_restarts}) "
                          f"after: {failure.text if failure else 'failure'}{moved}")
        finally:
            restore()
            for f in self.logs.values():
                f.close()
            text = self.recovery.end(attempt + 1, outcome, self.plan.world_size)
            if text and self.plan.max_restarts:
                self._say(text)

    def _await_fencing(self) -> None:
        """Before the next attempt: a lost host's agent may still run its ranks (a split
        network); it stops them once it has not heard from us for ``fence_timeout`` s, counted
        from when we stopped pinging it. Start nothing before that."""
        if self.fenced_by is None:
            return
        left = self.fenced_by - time.monotonic()
        if left > 0:
            self._say(f"waiting {left:.1f} s more for the lost host(s)' agents to stop their "
                      "ranks (an agent cut off from the launcher stops them itself)")
            while left > 0 and not self.interrupts:
                time.sleep(min(POLL, left))
                left = self.fenced_by - time.monotonic()
        self.fenced_by = None

    def _cut_off(self) -> None:
        """A host's agent is unreachable from now on (we stop pinging it)."""
        if self.plan.fence_timeout > 0:
            self.fenced_by = time.monotonic() + self.plan.fence_timeout + 2 * POLL

    def _ping(self, agents) -> None:
        """Fencing: every agent hears from us each heartbeat interval."""
        now = time.monotonic()
        if self.plan.fence_timeout <= 0 or now < self.next_ping:
            return
        self.next_ping = now + self.plan.heartbeat_interval
        for a in agents:
            if not a.finished:
                self.runner.send(a, events.CMD_PING)

    def _use_plan(self, plan: WorldPlan) -> None:
        """The next attempts run ``plan`` (an elastic restart): the runner builds its agents from it."""
        self.plan = self.runner.plan = plan
        self.prefixes = plan.prefixes()

    # ---- one attempt ---------------------------------------------------------------------------
    def _run_once(self, attempt: int) -> tuple:
        self.q: queue.Queue = queue.Queue()
        self.failures: list[Failure] = []
        self.stop_sent: str | None = None
        self.stop_deadline: float | None = None
        self.lost_hosts: dict = {}  # host -> why, for the restart policy
        self.detected: float | None = None  # when the first failure of this attempt was seen
        self.recovery.begin()
        self.attempt = attempt
        self.in_process.inflight = None
        self._open_logs(attempt)
        agents = [AgentProcess(**spec) for spec in self.runner.agent_specs(attempt)]
        now = time.monotonic()
        last_seen = {n: now for a in agents for n in a.node_ranks}
        heard: set = set()  # nodes whose agent has sent anything: the heartbeat timeout applies
        self.watch = watchdog.Watchdog(self.hang_timeout, {
            r: self.plan.node(n)["host"] for n in last_seen for r in self.plan.node(n)["ranks"]},
            now) if self.hang_timeout > 0 else None
        self.view = jobview.JobView({r: self.plan.node(n)["host"] for n in last_seen
                                     for r in self.plan.node(n)["ranks"]}, attempt)
        if self.monitor is not None:
            self.monitor.start()
        owner = {n: a for a in agents for n in a.node_ranks}
        node_done: set = set()
        exits: dict = {}  # rank -> exit event
        agents += self.in_process.warm_spares(attempt)
        for a in agents:
            self._start_agent(a)

        lost: set = set()
        self.next_ping = 0.0
        while not all(a.finished for a in agents):
            self._check_interrupts(agents)
            self._ping(agents)
            self.in_process.tick(agents)
            self.in_process.release_warm_spares(agents)
            self._watch(agents)
            self._publish()
            now = time.monotonic()
            # Events already queued are read first: a launcher that was slow to run (a loaded
            # host) must not call a node lost whose heartbeats are waiting in the queue.
            for n, seen in last_seen.items() if self.q.empty() else ():
                silent = self._silent(owner[n], seen, now)
                limit = (self.heartbeat_timeout if n in heard
                         else max(self.heartbeat_timeout, START_TIMEOUT))
                if n not in node_done and n not in lost and silent > limit:
                    lost.add(n)
                    host = self.plan.node(n)["host"]
                    why = (f"no heartbeat for {limit:g} s" if n in heard
                           else f"its agent never reported, {limit:g} s after the launch")
                    self.lost_hosts[host] = why
                    failure = Failure(time.time() - silent, "lost",
                                      f"host {host} (node {n}) lost: {why}", host=host)
                    if not self.in_process.take_lost_host(n, failure, agents, attempt):
                        self._fail(failure, agents)
                    for a in agents:  # its agent is unreachable: drop the connection too
                        if n in a.node_ranks:
                            self._kill_agent(a)
                    self._cut_off()
                    spare = self.in_process.take_spare_start()
                    if spare is not None:  # node n's ranks start again on a spare host
                        for a in agents:  # the old agent's end (EOF) is no node's any more
                            if n in a.node_ranks:
                                a.node_ranks = [m for m in a.node_ranks if m != n]
                        # its warm agent's standbys take them, else a new agent starts them
                        new = self.in_process.adopt(n, spare[1], agents)
                        if new is None:
                            new = self._spare_agent(n, spare[1], attempt)
                            agents.append(new)
                            self._start_agent(new)
                        owner[n], last_seen[n] = new, time.monotonic()
                        lost.discard(n)
                        heard.discard(n)  # a new agent: the start timeout applies again
                        self.prefixes = self.plan.prefixes()
            if self.stop_deadline is not None and now > self.stop_deadline:
                for a in agents:
                    if not a.finished:
                        self._kill_agent(a)
                        # The agent is gone but something it started outside its group (mpirun's
                        # ssh to a dead host) can hold the pipe open forever: stop waiting for EOF.
                        if a.proc is not None and a.proc.poll() is not None \
                                and now > self.stop_deadline + PIPE_SLACK:
                            a.finished = True
                            node_done.update(a.node_ranks)
            try:
                kind, a, item = self.q.get(timeout=POLL)
            except queue.Empty:
                continue
            if kind == "eof":
                a.finished = True
                rc = a.proc.wait()
                missing = [n for n in a.node_ranks if n not in node_done and n not in lost]
                if missing and not self.stop_sent:
                    tail = list(a.stderr_tail)
                    host = self.plan.node(missing[0])["host"] if len(a.node_ranks) == 1 else None
                    if host and rc == SSH_DROPPED:  # the connection, not the agent: liveness
                        self.lost_hosts[host] = f"connection to its agent dropped (code {rc})"
                        self._cut_off()
                    self._fail(Failure(time.time(), "agent",
                                       f"the agent for {a.label} exited (code {rc}) before its ranks "
                                       f"finished", tail, "agent stderr:", host=host), agents)
                node_done.update(a.node_ranks)  # nothing more will come from it
                continue
            ev = item
            n = ev.get("node_rank")
            if n in last_seen:
                last_seen[n] = time.monotonic()
                heard.add(n)
            name = ev.get("event")
            if self.watch is not None:
                self.watch.event(ev, time.monotonic())
            if name in (events.HEARTBEAT, events.EXIT):
                self.view.event(ev, time.monotonic())
            if name == events.STARTED:
                a.pids.update(ev.get("pids") or {})
            elif name == events.HEARTBEAT:
                self.recovery.on_progress(ev.get("progress") or {})
                self.in_process.on_heartbeat(ev)
            elif name == events.EXIT:
                exits[ev["rank"]] = ev
                if errors.counts_as_failure(ev) and \
                        not self.in_process.take_exit(ev, agents, attempt):
                    self._fail(errors.rank_failure(ev), agents)
            elif name == events.RECOVER_ACK:
                self.in_process.on_ack(ev, agents)
            elif name == events.DONE:
                node_done.add(n)
            elif name == events.ERROR:
                self._fail(Failure(time.time(), "agent", ev.get("message", "agent error"),
                                   host=ev.get("host")), agents)

        # Hosts heard from just now need no probe before a restart (recovery.py).
        end = time.monotonic()
        self.recovery.heard = {self.plan.node(n)["host"] for n, seen in last_seen.items()
                               if n not in lost and end - seen < self.heartbeat_timeout}
        # the ranks this launcher started (with --no_ssh, only its own node's)
        expected = sum(len(self.plan.node(n)["ranks"]) for a in agents for n in a.node_ranks
                       if n not in self.in_process.dropped_nodes)
        code, failure = self._finish(exits, expected)
        self._end_view(code)
        return code, failure

    def _start_agent(self, a: AgentProcess) -> None:
        try:
            a.proc = subprocess.Popen(
                a.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the terminal reaches only the launcher
                **a.popen_kwargs,
            )
        except OSError as exc:
            self._fail(Failure(time.time(), "agent", f"cannot start the agent for {a.label}: {exc}"))
            a.finished = True
            return
        self.runner.hand_over(a)
        threading.Thread(target=self._read_stdout, args=(a,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(a,), daemon=True).start()

    def warm_spare_agent(self, host: str, slots: list, attempt: int) -> AgentProcess:
        """An agent on spare ``host`` that starts standby processes only, ready to take a lost
        host's ranks (``adopt``); it carries no node's events until then."""
        node = {"node_rank": -1, "host": host, "slots": list(slots), "ranks": []}
        argv = self.runner.agent_argv(node, attempt) + [
            "--warm-spare", json.dumps({"host": host, "slots": list(slots)})]
        return AgentProcess(argv=self.runner.wrap(node, argv), node_ranks=[],
                            label=f"{host} (warm spare)", warm_host=host)

    def _spare_agent(self, n: int, word: dict, attempt: int) -> AgentProcess:
        """The agent for node ``n`` on the spare host the plan now gives it, its ranks started as
        in-process replacements under ``word``."""
        node = self.plan.node(n)
        argv = self.runner.agent_argv(node, attempt) + ["--join", json.dumps(word)]
        return AgentProcess(argv=self.runner.wrap(node, argv), node_ranks=[n], label=node["host"])

    # ---- the live job view ---------------------------------------------------------------------
    def _title(self) -> str:
        hosts = len({n["host"] for n in self.plan.nodes})
        return (f"dslaunch job: {self.plan.world_size} ranks on {hosts} host(s), attempt "
                f"{self.view.attempt}")

    def _publish(self, state: str = "running", force: bool = False) -> None:
        """About once a second: the status file (with a log dir) and the live table; the
        straggler report when SIGUSR1 asked for it."""
        if self.report_requested:
            self.report_requested = False
            self._say(stragglers.report(self.view.job(), self.straggler_threshold))
        now = time.monotonic()
        if not (force or self.view.due(now)) or not (self.plan.log_dir or self.monitor):
            return
        snapshot = self.view.snapshot(now, state, self.straggler_threshold)
        if self.plan.log_dir:
            jobview.write_status(self.plan.log_dir, snapshot)
        if self.monitor is not None and state == "running":
            with self.out_lock:  # the readers print ranks' lines through the same console
                self.monitor.update(snapshot["ranks"], self._title())

    def _end_view(self, code: int) -> None:
        state = "finished" if code == 0 else "interrupted" if self.interrupts else "failed"
        self._publish(state, force=True)
        if self.monitor is not None:
            with self.out_lock:
                self.out.flush()
                self.monitor.stop(self.view.live(time.monotonic()), f"{self._title()}: {state}")
            self._say(stragglers.report(self.view.job(), self.straggler_threshold))

    def _finish(self, exits: dict, expected: int) -> tuple:
        if self.interrupts:
            self._say(f"interrupted ({self.interrupt_name}): stopped all {expected} ranks")
            return (130 if self.interrupt_name == "SIGINT" else 143), None
        if not self.failures:
            missing = expected - len(exits)
            if missing == 0 and all(e.get("returncode") == 0 for e in exits.values()):
                return 0, None
            root = Failure(time.time(), "agent", f"{missing} rank(s) never reported their exit")
        else:
            root = errors.root_cause(self.failures)
        stopped = sum(1 for e in exits.values() if e.get("stopped"))
        self._say(errors.summary(root, self.failures, stopped))
        return 1, root

    # ---- failures ------------------------------------------------------------------------------
    def _fail(self, failure: Failure, agents=None) -> None:
        self.failures.append(failure)
        if self.detected is None:
            self.detected = time.time()
        if agents is not None:
            self._stop(agents, events.CMD_STOP_FAILURE)

    def _watch(self, agents) -> None:
        """Act on the hang watchdog: ask the agents for the suspects' stacks, then report. Nothing
        is printed before the report: a verdict whose ranks move on while their stacks come is
        withdrawn (a loaded host's slow stretch), and the user sees no false alarm."""
        if self.watch is None or self.stop_sent or self.in_process.inflight is not None:
            return
        action = self.watch.poll(time.monotonic(), time.time())
        if action is None:
            return
        if action.kind == "dump":
            if self.runner.queries:
                command = " ".join([events.CMD_DUMP_STACKS, *map(str, action.ranks)])
                for a in agents:
                    if not a.finished:
                        self.runner.send(a, command)
            return
        if action.kind == "withdraw":
            return
        if self.in_process.take_hang(action, agents, self.attempt):
            return
        self._say(action.report)
        what = "hang" if action.verdict == "hang" else "collectives desynchronised"
        culprit = action.ranks[0] if len(action.ranks) == 1 else None  # one suspect: the incident names it
        host = self.watch.ranks[culprit].host if culprit is not None else None
        self._fail(Failure(action.wall_time, "hang", f"{what}: {action.headline}", host=host,
                           rank=culprit), agents)

    def _after_in_process_recovery(self, renumber: dict | None) -> None:
        """The ranks run again on a new group: the watchdog's clocks start afresh (the survivors
        sat in a failed collective for the whole recovery) on the ranks as now numbered."""
        hosts = {r: rk.host for r, rk in (self.watch.ranks.items() if self.watch else ())}
        if renumber is not None:
            hosts = {new: hosts[int(old)] for old, new in renumber.items() if int(old) in hosts}
        else:  # the same ranks; a lost host's may have moved to a spare (the plan says where)
            hosts.update({r: node["host"] for node in self.plan.nodes for r in node["ranks"]
                          if r in hosts})
        if self.watch is not None:
            self.watch = watchdog.Watchdog(self.hang_timeout, hosts, time.monotonic())

    def _stop(self, agents, command: str) -> None:
        if self.stop_sent == command or (self.stop_sent == events.CMD_KILL):
            return
        self.stop_sent = command
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.plan.grace_period + KILL_SLACK
        for a in agents:
            self.runner.send(a, command)

    def _kill_agent(self, a: AgentProcess) -> None:
        # Also when its leader has exited: children left in its process group still hold its pipes.
        if a.proc is not None and not a.finished:
            self.runner.kill(a)

    def _say(self, text: str) -> None:
        with self.out_lock:
            if self.monitor is not None and self.monitor.interactive:  # above the live table
                for line in text.splitlines():
                    self.monitor.print(f"dslaunch: {line}\n")
                return
            self.out.flush()
            for line in text.splitlines():
                self.err.write(f"dslaunch: {line}\n")
            self.err.flush()

    # ---- signals -------------------------------------------------------------------------------
    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}

        def handler(signum, frame):
            if signum == signal.SIGUSR1:  # kill -USR1 <launcher pid>: the straggler report now
                self.report_requested = True
                return
            self.interrupts += 1
            self.interrupt_name = self.interrupt_name or signal.Signals(signum).name

        for s in old:
            signal.signal(s, handler)
        return lambda: [signal.signal(s, h) for s, h in old.items()]

    def _check_interrupts(self, agents) -> None:
        if self.interrupts == 1 and self.stop_sent is None:
            self._say(f"{self.interrupt_name}: stopping all ranks (again to kill them now)")
            self._stop(agents, events.CMD_STOP)
        elif self.interrupts >= 2 and self.stop_sent != events.CMD_KILL:
            self._stop(agents, events.CMD_KILL)
            self.stop_deadline = time.monotonic() + 2.0

    # ---- streams -------------------------------------------------------------------------------
    def _read_stdout(self, a: AgentProcess) -> None:
        lines = events.Unframer()
        for raw in _whole_lines(a.proc.stdout, a.output_demux, "stdout"):
            a.last_line = time.monotonic()
            raw = lines.feed(raw)
            if raw is not None:
                self._take_line(a, raw.decode("utf-8", "replace"))
        self.q.put(("eof", a, None))

    def _take_line(self, a: AgentProcess, line: str) -> None:
        ev = events.parse_event(line)
        if ev is not None:
            self.q.put(("event", a, ev))
            return
        a.writing_since = time.monotonic()
        self._show(line if line.endswith("\n") else line + "\n")
        if time.monotonic() - a.writing_since >= STALL:
            a.resumed_at = time.monotonic()
        a.writing_since = None

    @staticmethod
    def _silent(a: AgentProcess, seen: float, now: float) -> float:
        """How long a node of ``a`` has given no sign of life, last heartbeat at ``seen``. Its
        events come after the ranks' lines on the same pipe, so while our own stdout blocks (a
        slow terminal, a paused pager) they wait behind it: that silence is ours, not the node's.
        A line read from an agent that carries one node proves that node alive too."""
        if a.writing_since is not None:
            return 0.0
        alive = a.last_line if len(a.node_ranks) == 1 else 0.0
        return now - max(seen, alive, a.resumed_at)

    def _read_stderr(self, a: AgentProcess) -> None:
        for raw in _whole_lines(a.proc.stderr, a.output_demux, "stderr"):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            a.stderr_tail.append(line)
            with self.out_lock:
                self.err.write(f"[agent {a.label}] {line}\n")
                self.err.flush()

    def _show(self, line: str) -> None:
        with self.out_lock:
            if self.monitor is not None and self.monitor.interactive:  # above the live table
                self.monitor.print(line)
            else:
                self.out.write(line)
                self.out.flush()
            if self.logs:
                end = line.find("] ")
                rank = self.prefixes.get(line[:end + 2]) if end > 0 else None
                f = self.logs.get(rank)
                if f is not None:
                    f.write(line[end + 2:])
                    f.flush()

    def _open_logs(self, attempt: int) -> None:
        if not self.plan.log_dir:
            return
        os.makedirs(self.plan.log_dir, exist_ok=True)
        for n in self.plan.nodes:
            for r in n["ranks"]:
                if r not in self.logs:
                    self.logs[r] = open(os.path.join(self.plan.log_dir, f"rank_{r}.log"), "w")
                if attempt:
                    self.logs[r].write(f"--- dslaunch: restart {attempt} ---\n")
