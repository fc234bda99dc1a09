"""In-process recovery, the launcher's side (``dslaunch run --recover in-process``).

A failed rank no longer stops the job: its node's agent waits for our word, and we send every agent
``recover {json}`` (``events.py``): the survivors abort their collectives and join a new group on
a fresh store with the same ranks, the lost rank starts again on its node as a replacement that
takes its state from the survivors over the new group (the ranks' side:
``engine/recovery/``; ZeRO 0-3 shards from their copies). A lost host's ranks start
again the same way on a spare host of the hostfile when there is one (the world keeps its size);
else the other hosts' ranks go on as a smaller world when at least MIN hosts remain
(``take_lost_host``). Every rank answers (``recover_ack``), and the recovery counts against
``--max-restarts`` like a restart.

A hung rank (the watchdog's verdict naming one rank stuck outside any collective) is killed first
(``kill ranks R``), then recovered the same way.

Falls back to restarting every rank (the controller's ordinary failure path) when in-process
recovery cannot run: a lost host would leave fewer than MIN hosts, a second fault comes during a
recovery, no restart is left, a rank refuses (its engine cannot: offloaded optimizer or
parameters on NVMe, experts, ZeRO++ or hpZ, tensor groups other than AutoTP's at DP >= 2, a
pipeline at DP 1 or with tensor axes, no dslaunch engine; the
survivors disagree on the last completed step) or the ranks do not all answer within
``RECOVER_TIMEOUT``. The failure's text says which.

A survivor says ``recovering`` as soon as its main thread takes the word (its next collective
raises on the shut connections), and the recovery itself follows. With the hang watchdog on, a
survivor that has not said so ``hang_timeout`` (+ ``START_SLACK``) after the word is stuck outside
any collective (the watchdog's rule for a hang): a second fault, which no one would ever answer
for (a replacement waits for it in the new group), so we give up at once instead of after
``RECOVER_TIMEOUT`` (the watchdog itself is muted while a recovery is in flight). Replacements are
not held to it: they start a process first.
"""

from __future__ import annotations

import dataclasses
import json
import time

from dslaunch.launcher import errors, events
from dslaunch.launcher.plan import LOCAL_HOSTS, free_port
from dslaunch.recover_files import REFUSED_EXIT, standbys_off

RECOVER_TIMEOUT = 90.0  # seconds for every rank to answer (a replacement imports torch first)
START_SLACK = 2.0  # beyond the hang timeout, for a survivor to say it took the word (the agents'
# ack poll, a loaded host)


@dataclasses.dataclass
class InFlight:
    epoch: int
    failure: errors.Failure
    detected: float  # when we saw the fault (epoch seconds)
    deadline: float  # monotonic
    waiting: set  # ranks yet to answer
    acks: dict = dataclasses.field(default_factory=dict)
    lost_node: int | None = None  # a lost host's node the world goes on without
    survivors: set = dataclasses.field(default_factory=set)  # ranks that keep their processes
    started: set = dataclasses.field(default_factory=set)  # survivors that took the word
    sent: float = 0.0  # monotonic time the word went out
    renumber: dict | None = None  # {old rank (str): new rank} then
    spare: str | None = None  # the spare host a lost host's ranks started again on
    # the furthest step the heartbeats had shown when the word went out (the incident's last
    # step: by the last answer, survivors that answered first may be training further on)
    step_at_fault: int = -1


class InProcessRecovery:
    def __init__(self, controller):
        self.c = controller
        self.done = 0  # recoveries that worked (they count against --max-restarts)
        self.inflight: InFlight | None = None
        self.hung: dict = {}  # rank killed for a hang -> the watchdog's headline
        self.dropped_nodes: set = set()  # nodes of lost hosts the job went on without
        self.dropped_ranks = 0  # their ranks (no exit will come from them)
        self.spare_start: tuple | None = None  # (node, word): an agent to start on a spare host
        self.free_ports: dict = {}  # node rank -> the free port its agent's last heartbeat named

    @property
    def enabled(self) -> bool:
        return self.c.plan.recover == "in-process" and bool(getattr(self.c.runner, "queries", False))

    def _budget_left(self, attempt: int) -> bool:
        return attempt + self.done < self.c.plan.max_restarts

    # ---- a hung rank: kill it, recover from its exit --------------------------------------------
    def take_hang(self, action, agents, attempt: int) -> bool:
        """The watchdog reported a hang: with one suspect outside any collective, kill it (its exit
        then starts a recovery). False: the ordinary failure path."""
        c = self.c
        if not self.enabled or self.inflight is not None or not self._budget_left(attempt) \
                or action.verdict != "hang" or len(action.ranks) != 1:
            return False
        rank = action.ranks[0]
        rec = c.watch.ranks[rank].record or {}
        if rec.get("coll_op"):  # waiting in a collective itself: not a rank we can blame
            return False
        c._say(action.report)
        c._say(f"in-process recovery: killing hung rank {rank}; the others keep running")
        self.hung[rank] = action.headline
        for a in agents:
            if not a.finished:
                c.runner.send(a, f"{events.CMD_KILL_RANKS} {rank}")
        return True

    # ---- a failed rank ----------------------------------------------------------------------------
    def take_exit(self, ev: dict, agents, attempt: int) -> bool:
        """A rank failed: start an in-process recovery (True), or leave it to the ordinary failure
        path (False)."""
        c = self.c
        rank, host = ev["rank"], ev.get("host")
        if not self.enabled or c.stop_sent or c.interrupts or ev.get("returncode") == REFUSED_EXIT:
            return False
        if self.inflight is not None or not self._budget_left(attempt) or host in c.lost_hosts:
            return False
        failure = errors.rank_failure(ev)
        if rank in self.hung:
            failure = dataclasses.replace(failure, kind="hang",
                                          text=f"hang: {self.hung.pop(rank)}")
        epoch = self.done + 1
        plan = c.plan
        word = {"epoch": epoch, "world_size": plan.world_size, "master_addr": plan.master_addr,
                "master_port": self._store_port(epoch),
                "hosts": sorted({n["host"] for n in plan.nodes}),
                "replace": [{"rank": rank, "node_rank": ev["node_rank"],
                             "local_rank": ev["local_rank"]}]}
        self._send(word, failure, agents, plan.world_size)
        self.inflight.survivors.discard(rank)
        c._say(f"{failure.text}; recovering in process: the other {plan.world_size - 1} ranks keep "
               f"running, rank {rank} starts again on {host}")
        return True

    # ---- a lost host: go on without it ------------------------------------------------------------
    def take_lost_host(self, n: int, failure: errors.Failure, agents, attempt: int) -> bool:
        """Host of node ``n`` lost: the other hosts' ranks go on as a smaller world (renumbered in
        order) when at least MIN hosts remain. False: the ordinary failure path."""
        c = self.c
        plan = c.plan
        if not self.enabled or c.stop_sent or c.interrupts or self.inflight is not None \
                or not self._budget_left(attempt):
            return False
        live_nodes = [node for node in plan.nodes
                      if node["node_rank"] != n and node["node_rank"] not in self.dropped_nodes]
        if not live_nodes:
            return False
        spare = self._spare_for(plan.node(n))
        if spare is not None:
            return self._onto_spare(n, spare, live_nodes, failure, agents)
        minimum = plan.nnodes[0] if plan.nnodes else len(plan.nodes)
        if len(live_nodes) < minimum:
            return False
        survivors = [r for node in live_nodes for r in node["ranks"]]
        renumber = {str(old): new for new, old in enumerate(survivors)}
        first = live_nodes[0]
        master = self._store_host(first)
        epoch = self.done + 1
        word = {"epoch": epoch, "world_size": len(survivors), "master_addr": master,
                "master_port": self._store_port(epoch, first["node_rank"]),
                # every host's connections are shut (the lost one's most of all)
                "hosts": sorted({node["host"] for node in plan.nodes}), "replace": [],
                "renumber": renumber}
        self._send(word, failure, agents, len(survivors), lost_node=n)
        self.inflight.lost_node, self.inflight.renumber = n, renumber
        c._say(f"{failure.text}; recovering in process: the {len(survivors)} ranks of "
               f"{', '.join(node['host'] for node in live_nodes)} go on without it (world size "
               f"{plan.world_size} -> {len(survivors)})")
        return True

    # ---- a lost host, a spare waiting: its ranks start again there ------------------------------
    def _spare_for(self, node: dict) -> str | None:
        """The first spare host of the hostfile (not lost, with slots for all of ``node``'s
        ranks), or None."""
        c = self.c
        if not getattr(c.runner, "adds_agents", False):
            return None
        for host, slots in c.plan.spares.items():
            if host not in c.lost_hosts and len(slots) >= len(node["ranks"]):
                return host
        return None

    def _onto_spare(self, n: int, spare: str, live_nodes: list, failure, agents) -> bool:
        """The world keeps its size: the survivors recover in process and node ``n``'s ranks start
        again on ``spare`` as replacements (an agent started there with the recover word; the
        controller starts it: ``take_spare_start``)."""
        c = self.c
        plan = c.plan
        node = plan.node(n)
        lost_host = node["host"]
        first = live_nodes[0]
        epoch = self.done + 1
        word = {"epoch": epoch, "world_size": plan.world_size,
                "master_addr": self._store_host(first),
                "master_port": self._store_port(epoch, first["node_rank"]),
                "hosts": sorted({nd["host"] for nd in plan.nodes} | {spare}),
                "replace": [{"rank": r, "node_rank": n, "local_rank": i}
                            for i, r in enumerate(node["ranks"])]}
        self._send(word, failure, agents, plan.world_size, lost_node=n)
        self.inflight.survivors -= set(node["ranks"])
        self.inflight.spare = spare
        # the node moves: later restarts plan it there too (the lost host is excluded)
        node["host"], node["slots"] = spare, list(plan.spares.pop(spare))[:len(node["ranks"])]
        self.spare_start = (n, word)
        c._say(f"{failure.text}; recovering in process: rank(s) "
               f"{', '.join(map(str, node['ranks']))} of {lost_host} start again on the spare "
               f"host {spare}, the other {plan.world_size - len(node['ranks'])} ranks keep running")
        return True

    # ---- warm spares: standbys on the spare hosts, started with the job ---------------------------
    def warm_spares(self, attempt: int) -> list:
        """An agent for each spare host of the hostfile, whose standby processes (torch imported,
        waiting at dslaunch's first call) take a lost host's ranks without a process start
        (DSLAUNCH_RECOVER_STANDBY=0: none, as for the nodes' own standbys)."""
        c = self.c
        if not self.enabled or not getattr(c.runner, "adds_agents", False) or \
                standbys_off(c.plan.env):
            return []
        return [c.warm_spare_agent(host, slots, attempt) for host, slots in c.plan.spares.items()
                if slots]

    def adopt(self, n: int, word: dict, agents):
        """Node ``n``'s ranks start on the spare host's warm agent, if one runs there: it is
        told to take node ``n`` (``adopt``) and carries its events from now on. None: no warm
        agent there (the controller starts a new one)."""
        host = self.c.plan.node(n)["host"]  # (the spare: _onto_spare moved the node there)
        for a in agents:
            if a.warm_host == host and not a.finished and a.proc is not None \
                    and a.proc.poll() is None:
                msg = json.dumps({"node_rank": n, "word": word}, separators=(",", ":"))
                self.c.runner.send(a, f"{events.CMD_ADOPT} {msg}")
                a.warm_host, a.node_ranks, a.label = None, [n], host
                return a
        return None

    def release_warm_spares(self, agents) -> None:
        """The job's own agents are done: the warm spares' standbys are not needed any more."""
        warm = [a for a in agents if a.warm_host and not a.finished]
        if warm and all(a.finished for a in agents if not a.warm_host):
            for a in warm:
                self.c.runner.send(a, events.CMD_STOP)
                a.warm_host = None  # (once)

    def take_spare_start(self) -> tuple | None:
        """(node rank, recover word) of an agent the controller must start on a spare now, once."""
        start, self.spare_start = self.spare_start, None
        return start

    def on_heartbeat(self, ev: dict) -> None:
        if ev.get("free_port"):
            self.free_ports[ev.get("node_rank")] = int(ev["free_port"])

    def _store_port(self, epoch: int, store_node: int = 0) -> int:
        """The new group's store port, on node ``store_node``'s host. Not the job's port +
        epoch, which was taken once in a loaded test run (gloo's own listeners use the same
        ephemeral range): on this host one the kernel says is free now; on another, the one
        its agent found free at its last heartbeat (a second ago at most); port + epoch only
        before any heartbeat."""
        plan = self.c.plan
        if all(n["host"] in LOCAL_HOSTS for n in plan.nodes):
            return free_port()
        if store_node in self.free_ports:
            return self.free_ports[store_node]
        return plan.master_port + epoch

    def _store_host(self, first: dict) -> str:
        """Where the new group's store goes: the job's master address while node 0 lives, else
        the first live node's host."""
        return self.c.plan.master_addr if first["node_rank"] == 0 else first["host"]

    def _send(self, word: dict, failure, agents, world_size: int, lost_node: int | None = None):
        """The ``recover`` word to every live agent (not the lost node's); the recovery is in
        flight until all ``world_size`` ranks answer."""
        line = f"{events.CMD_RECOVER} {json.dumps(word, separators=(',', ':'))}"
        for a in agents:
            if not a.finished and lost_node not in a.node_ranks and not a.warm_host:
                self.c.runner.send(a, line)
        now = time.monotonic()
        self.inflight = InFlight(word["epoch"], failure, time.time(), now + RECOVER_TIMEOUT,
                                 set(range(world_size)), survivors=set(range(world_size)), sent=now,
                                 step_at_fault=self.c.recovery.current.step)

    # ---- the ranks' answers -----------------------------------------------------------------------
    def on_ack(self, ev: dict, agents) -> None:
        inf = self.inflight
        if inf is None or ev.get("epoch") != inf.epoch:
            return
        if ev.get("status") == "refused":
            self._give_up(f"rank {ev.get('rank')} refused: {ev.get('why')}", agents)
            return
        if ev.get("status") == "recovering":  # under way; its answer follows
            inf.started.add(int(ev["rank"]))
            return
        inf.acks[int(ev["rank"])] = ev
        inf.waiting.discard(int(ev["rank"]))
        if not inf.waiting:
            self._finished()

    def tick(self, agents) -> None:
        inf = self.inflight
        if inf is None:
            return
        now = time.monotonic()
        if now > inf.deadline:
            missing = ", ".join(map(str, sorted(inf.waiting)))
            self._give_up(f"rank(s) {missing} did not answer within {RECOVER_TIMEOUT:g} s", agents)
            return
        hang_timeout = getattr(self.c, "hang_timeout", 0) or 0
        if hang_timeout > 0 and now > inf.sent + hang_timeout + START_SLACK:
            stuck = sorted((inf.survivors & inf.waiting) - inf.started)
            if stuck:
                self._give_up(f"surviving rank(s) {', '.join(map(str, stuck))} did not take up the "
                              f"recovery within {hang_timeout + START_SLACK:g} s (hung outside any "
                              "collective: a second fault)", agents)

    def _give_up(self, why: str, agents) -> None:
        inf, self.inflight = self.inflight, None
        self.c._say(f"in-process recovery failed ({why}): restarting every rank instead")
        failure = dataclasses.replace(inf.failure, text=f"{inf.failure.text} (in-process recovery "
                                                        f"failed: {why})")
        self.c._fail(failure, agents)

    def _finished(self) -> None:
        inf, self.inflight = self.inflight, None
        self.done += 1
        acks = list(inf.acks.values())

        def phase(key):
            return max(((a.get("seconds") or {}).get(key, 0.0) for a in acks), default=0.0)

        steps = {a.get("step") for a in acks}
        step = max(s for s in steps if s is not None)
        seconds = time.time() - inf.failure.time
        before, after = self.c.plan.world_size - self.dropped_ranks, len(acks)
        self.c.recovery.in_process(self.c.attempt, inf.failure, inf.detected, step, before,
                                   inf.step_at_fault, abort=phase("abort"),
                                   rebuild=phase("rebuild"), state=phase("state"),
                                   world_size_after=after)
        joined = sorted(int(a["rank"]) for a in acks if a.get("status") == "joined")
        if inf.lost_node is not None:
            self.dropped_nodes.add(inf.lost_node)
            self.dropped_ranks += before - after
            what = f"the world went on without the lost host ({before} -> {after} ranks)"
        else:
            what = f"rank(s) {', '.join(map(str, joined))} replaced" + \
                (f" on the spare host {inf.spare}" if inf.spare else "")
        self.c._say(f"recovered in process {seconds:.1f} s after the fault: {what}, the others "
                    f"kept their processes; training goes on from step {step}")
        self.c._after_in_process_recovery(inf.renumber)
