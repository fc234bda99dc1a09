"""This rank's in-process recovery, as ``initialize`` builds it and hands it to the engine
(``recovery_for_this_rank``): the seams of ``core/recovery_seams.py`` filled in with ``guard.py``,
the shard copies kept from the start (``keep_shard_copies``), and a replacement's join."""

from __future__ import annotations

from dslaunch.engine.comm.membership import join_word
from dslaunch.engine.core.recovery_seams import NoRecovery
from dslaunch.engine.recovery import guard, rejoin
from dslaunch.engine.recovery.refusals import layout_refused, shard_copies_refused
from dslaunch.engine.recovery.shard_copies import ShardCopies
from dslaunch.engine.recovery.watch import Watch


def recovery_for_this_rank() -> NoRecovery:
    """``InProcessRecovery`` under ``dslaunch run --recover in-process`` (the launcher's
    watch file, or a replacement's instruction), else the do-nothing ``NoRecovery``."""
    return InProcessRecovery() if Watch.env_present() or join_word() else NoRecovery()


def keep_shard_copies(engine) -> None:
    """ZeRO 1-3 under in-process recovery: each rank keeps a copy of a neighbour's shard
    (``shard_copies.py``), taken now and after every optimizer update."""
    if engine.zero_stage not in (1, 2, 3) or layout_refused(engine) \
            or shard_copies_refused(engine):
        return
    engine.strategy.copies = ShardCopies()
    engine.strategy.copies.exchange(engine.strategy)


class InProcessRecovery(NoRecovery):
    """The seams that turn a lost peer into a recovery (``watch`` is None for a replacement
    started without a watch file: it joins, and then runs its calls as they are)."""

    def __init__(self):
        self.watch: Watch | None = None

    def attach(self, engine) -> None:
        self.watch = Watch.from_env()  # (starts its thread: the launcher's word is awaited)
        if self.watch is not None:  # ZeRO 1-3: a copy of each rank's shard on another
            keep_shard_copies(engine)

    def start(self, engine) -> None:
        word = join_word()
        if word:  # a replacement, built alone: joins the survivors and takes their state
            rejoin.join(engine, word)
        if self.watch is not None:
            guard.watch_script_collectives(engine)

    def forward_starts(self) -> None:
        if self.watch is not None and not self.watch.abandoning:
            self.watch.script_skip = False  # a step starts: the script's collectives count

    def forward(self, engine, fn):
        if self.watch is None:
            return fn()
        return guard.guarded_forward(engine, fn)  # ZeRO 3 gathers in forward: a peer can fail it

    def backward(self, engine, fn, *args):
        if self.watch is None:
            return fn(*args)
        return guard.guarded(engine, "backward", fn, *args)

    def step(self, engine, fn, *args):
        if self.watch is None:
            return fn(*args)
        return guard.guarded(engine, "step", fn, *args)

    def train_batch(self, engine, data_iter):
        if self.watch is None:
            return engine._run_batch(data_iter)
        return guard.train_batch(engine, data_iter)

    def save(self, engine, save):
        return guard.abandonable_save(engine, save)

    def holds_live_state(self, engine) -> bool:
        return guard.holds_live_state(engine)

    def engine_call(self, engine):
        return guard.engine_call(engine)
