"""The agent's side of in-process recovery (``dslaunch run --recover in-process``; the ranks' side
is ``engine/recovery/``, the launcher's ``launcher/inprocess.py``), a mix-in of
``agent.Agent``: the launcher's ``recover`` word to the running ranks (their instruction files)
and replacements for the lost ones, a warm spare adopting a lost host's node, the standby processes
that become lost ranks without a process start, and the ranks' answers forwarded to the launcher.

The mix-in reads what the agent sets up: ``plan``, ``node``, ``node_rank``, ``host``, ``warm``,
``restart_count``, ``gpus``, ``ranks``, ``standby_pool``, ``pending_acks``, ``started_acks``,
``stopping``, and calls its ``event``, ``say``, ``recover_file``, ``progress_file``,
``rank_env``, ``_start_rank``, ``_wait_rank`` and ``_alive``. No torch.
"""

from __future__ import annotations

import json
import os
import threading
import time

from dslaunch import recover_files
from dslaunch.launcher import events
from dslaunch.launcher.bootstrap import STACK_FILE_ENV
from dslaunch.launcher.idleness import Idleness
from dslaunch.launcher.rank_process import Rank


class InProcessRecovery:
    """The agent's in-process recovery (the module's docstring), mixed into ``agent.Agent``."""

    def _recover(self, text: str) -> None:
        """The launcher's ``recover`` word: each running rank of ours gets it in its instruction
        file (it aborts its collectives and joins the new group); each rank of ours it lists
        under ``replace`` starts again as a new process that joins the survivors."""
        try:
            word = json.loads(text)
        except ValueError:
            self.event(events.ERROR, message=f"unreadable recover word: {text[:200]}")
            return
        epoch = int(word["epoch"])
        renumber = word.get("renumber")  # a lost host: the others go on as a smaller world
        if renumber:
            self.node["ranks"] = [renumber.get(str(r), r) for r in self.node["ranks"]]
            self.plan.world_size = int(word["world_size"])
        for r in self._alive():
            if renumber:
                r.rank = renumber.get(str(r.rank), r.rank)
            path = self.recover_file(r.local_rank)
            self.pending_acks[r.local_rank] = (r.rank, epoch)
            recover_files.write_json(path, {**word, "rank": r.rank})
        self._start_replacements(word)

    def _adopt(self, text: str) -> None:
        """A warm spare becomes the agent of a lost host's node (``adopt {"node_rank": n, "word":
        recover word}``): that node's ranks start here from the standbys already waiting, as
        replacements that join the survivors."""
        try:
            msg = json.loads(text)
            n, word = int(msg["node_rank"]), msg["word"]
            node = self.plan.node(n)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.event(events.ERROR, message=f"unreadable adopt word: {exc}: {text[:200]}")
            return
        slots = self.node["slots"]
        node["host"], node["slots"] = self.host, slots[:len(node["ranks"])]
        self.node, self.node_rank, self.warm = node, n, False
        self.say(f"taking over node {n} (ranks {', '.join(map(str, node['ranks']))}) from its "
                 f"{len(self.standby_pool)} warm standby process(es)")
        self._start_replacements(word)

    def _start_replacements(self, word: dict) -> None:
        """Each rank of ours the recover ``word`` lists under ``replace`` starts again as a new
        process (a standby promoted when one waits) that joins the survivors."""
        epoch = int(word["epoch"])
        for new in word.get("replace", []):
            if int(new["node_rank"]) != self.node_rank:
                continue
            local_rank, rank = int(new["local_rank"]), int(new["rank"])
            path = self.recover_file(local_rank)
            for stale in (path, recover_files.ack_path(path)):
                if os.path.exists(stale):
                    os.unlink(stale)
            extra = self._replacement_env(word, rank, local_rank)
            try:
                r = self._promote(rank, local_rank, extra) or self._start_rank(rank, local_rank, extra)
            except (OSError, RuntimeError) as exc:
                self.event(events.RECOVER_ACK, rank=rank, epoch=epoch, status="refused",
                           why=f"cannot start the replacement on {self.host}: {exc}")
                continue
            self.event(events.STARTED, pids={str(rank): r.proc.pid}, replacement=True)

    def _join_env(self, rank: int, local_rank: int) -> dict | None:
        """At start, with ``self.join`` (a spare host taking a lost host's ranks): each rank is a
        replacement. None: an ordinary start."""
        return None if self.join is None else self._replacement_env(self.join, rank, local_rank)

    def _replacement_env(self, word: dict, rank: int, local_rank: int) -> dict:
        """The extra environment of a replacement for ``rank`` under the recover ``word``; its
        answer will be forwarded like a survivor's."""
        epoch = int(word["epoch"])
        self.pending_acks[local_rank] = (rank, epoch)
        return {recover_files.JOIN_ENV: json.dumps({**word, "rank": rank}),
                # --inject faults are per attempt: the replacement must not meet its own again
                "DSLAUNCH_RESTART_COUNT": str(self.restart_count + epoch)}

    def _warm_count(self) -> int:
        """A warm spare's standbys: enough for the largest node's ranks, within its slots."""
        if not self.warm:
            return 0
        return max(1, min(len(self.node["slots"]) or 1,
                          max(len(n["ranks"]) for n in self.plan.nodes)))

    def _start_standby(self, count: int = 1) -> None:
        """With in-process recovery, warm processes (one per node, ``count`` on a warm spare;
        DSLAUNCH_RECOVER_STANDBY=0: none): a lost rank is replaced without a process start, torch
        import and model build on the recovery's path."""
        if self.plan.recover != "in-process" or self.stopping.is_set() or \
                recover_files.standbys_off(self.plan.env):
            return
        for _ in range(count):
            try:
                self.standby_pool.append(self._start_rank(-1, 0, standby=True))
            except (OSError, RuntimeError) as exc:
                self.say(f"no standby process for in-process recovery: {exc}")
                return

    def _promote(self, rank: int, local_rank: int, extra: dict) -> Rank | None:
        """A standby becomes ``rank`` (None: there is none alive)."""
        while self.standby_pool and self.standby_pool[0].proc.poll() is not None:
            self.standby_pool.pop(0)  # (one that died waiting)
        if not self.standby_pool:
            return None
        r = self.standby_pool.pop(0)
        env = self.rank_env(rank, local_rank, self.gpus)
        env.update(extra)
        env.pop(STACK_FILE_ENV, None)  # its faulthandler already writes to its own file
        delta = {k: v for k, v in env.items() if r.launch_env.get(k) != v}
        r.rank, r.local_rank, r.progress_file = rank, local_rank, self.progress_file(rank)
        r.idleness = Idleness(time.monotonic())
        recover_files.write_json(r.standby_file, {"env": delta})
        self.ranks.append(r)
        threading.Thread(target=self._wait_rank, args=(r,), daemon=True).start()
        return r

    def _forward_acks(self) -> None:
        """Send on what the ranks answered to a recover word (their ack files)."""
        for local_rank, (rank, epoch) in list(self.pending_acks.items()):
            ack = recover_files.read_json(recover_files.ack_path(self.recover_file(local_rank)))
            if ack is None or ack.get("epoch") not in (epoch, 0):
                continue
            if ack.get("status") == "recovering":  # under way: the final answer follows
                if self.started_acks.get(local_rank) != epoch:
                    self.started_acks[local_rank] = epoch
                    self.event(events.RECOVER_ACK, rank=rank, **{**ack, "epoch": epoch})
                continue
            del self.pending_acks[local_rank]
            self.event(events.RECOVER_ACK, rank=rank, **{**ack, "epoch": epoch})
            if ack.get("status") == "joined" and not self.standby_pool:
                self._start_standby()  # for the next fault, once this one is over (CPU)
