"""The engine's seams under in-process recovery: its ``forward``, ``backward``, ``step``, a
pipeline's ``train_batch``, a checkpoint's save, and the script's own collectives, run so that a
collective failing because of a lost peer turns into a recovery (``rejoin.recover``) instead of an
exception, and the interrupted step is abandoned on every member.

The script never gets a value the fault-free run would not have given it: its own collective that
a lost peer interrupted, or one it makes later in the abandoned step, raises ``StepAbandoned``
(``comm/membership.py``) after the recovery instead of returning this rank's unreduced tensor; the
script's loop catches it and starts its next iteration, the same step again, where a replacement
starts too."""

from __future__ import annotations

import contextlib

from dslaunch import torch_progress
from dslaunch.engine.comm.membership import StepAbandoned, peer_lost
from dslaunch.engine.parallel.tensor_parallel import dry_collectives
from dslaunch.engine.recovery import pipe
from dslaunch.engine.recovery.rejoin import recover
from dslaunch.engine.recovery.tp import tp_grid


def guarded(engine, name: str, fn, *args, **kwargs):
    """Run the engine's ``backward``/``step`` so that a collective failing because of a lost
    peer turns into a recovery (``recover``) instead of an exception; the interrupted step's
    remaining calls are then skipped (``backward`` returns its loss, ``step`` nothing) until the
    script's loop has made the ``step()`` calls left of that step (one per micro-batch), so
    that it starts the step again at its first micro-batch, as a replacement does."""
    watch = engine._recovery.watch
    if watch.abandoning:
        if name == "step":
            watch.abandoning -= 1
            return None
        return args[0] if args else None
    gas = engine._gas
    micro = engine.micro_steps % gas  # (before the recovery resets the count)
    with engine_call(engine):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            if not peer_lost(exc) or not watch.wait_for_word():
                raise
            recover(engine, watch)
    # the step() calls the script still makes for the abandoned step: this micro-batch's (unless
    # the fault came inside it) and the later ones'
    watch.abandoning = gas - micro - (1 if name == "step" else 0) \
        if engine._managed_accumulation else (0 if name == "step" else 1)
    watch.script_skip = True
    return None if name == "step" else (args[0] if args else None)


def guarded_forward(engine, fn):
    """Run the module's forward (``fn``) as ``guarded`` runs ``backward``/``step``: at ZeRO 3 it
    gathers parameters, so a lost peer can fail it. After the recovery, and in every forward of
    the abandoned step (its remaining ``backward``/``step`` calls are skipped), the forward runs
    dry (``strategy.dry_forward``: no collective, zero weights at stage 3): its output only
    carries the script to the end of that step."""
    watch = engine._recovery.watch
    if watch.abandoning:
        with dry_forward(engine):
            return fn()
    micro = engine.micro_steps % engine._gas  # (before the recovery resets the count)
    with engine_call(engine):
        try:
            return fn()
        except RuntimeError as exc:
            if not peer_lost(exc) or not watch.wait_for_word():
                raise
            recover(engine, watch)
    # this micro-batch's step() call and the later ones'; its backward is skipped with them
    watch.abandoning = engine._gas - micro if engine._managed_accumulation else 1
    watch.script_skip = True
    with dry_forward(engine):
        return fn()


def dry_forward(engine):
    """The context of a forward that makes no collective: the strategy's (ZeRO 3 gathers) and,
    under AutoTP, the split layers' (``tensor_parallel.dry_collectives``)."""
    stack = contextlib.ExitStack()
    stack.enter_context(engine.strategy.dry_forward())
    if tp_grid(engine) is not None:
        stack.enter_context(dry_collectives())
    return stack


class engine_call:
    """``with engine_call(engine):`` the collectives inside are the engine's own (a checkpoint's
    save or load), not the script's: the engine call itself decides what a lost peer there
    means."""

    def __init__(self, engine):
        self.watch = engine._recovery.watch

    def __enter__(self):
        if self.watch is not None:
            self.watch.in_engine += 1

    def __exit__(self, *exc):
        if self.watch is not None:
            self.watch.in_engine -= 1


class ScriptCollectives:
    """The collectives the script makes itself (``torch.distributed`` calls outside any engine
    call, seen by the bootstrap's wrappers: ``dslaunch/torch_progress.py``), such as the loss
    all-reduce most training loops log with. One that fails on a lost peer starts the same
    recovery as the engine's own and then raises ``StepAbandoned``: its outputs hold this rank's
    own values, not the reduced ones. So does the first one the script makes after a recovery in
    the rest of the abandoned step (the engine's calls there are skipped), without making it: a
    replacement starts at the top of the loop, and the survivors meet it there once the script has
    caught the exception and gone on to its next iteration. Either ends the abandoned step: the
    script's next calls are real ones."""

    def __init__(self, engine):
        self.engine = engine

    def applies(self) -> bool:
        watch = self.engine._recovery.watch
        return watch is not None and watch.in_engine == 0

    def call(self, fn, op: str, args, kwargs):
        watch = self.engine._recovery.watch
        if watch.script_skip:  # later in a step a recovery abandoned: no value to give
            end_abandoned_step(watch)
            raise StepAbandoned(f"{op}: the step was abandoned by an in-process recovery (a peer "
                                "was lost and replaced); start the loop's next iteration")
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            with engine_call(self.engine):  # the recovery's own collectives
                if not recover_between_steps(self.engine, exc):
                    raise
            end_abandoned_step(watch)
            raise StepAbandoned(f"{op} was interrupted by a lost peer, which was replaced in "
                                "process; start the loop's next iteration") from None


def end_abandoned_step(watch) -> None:
    """The script leaves the abandoned step (``StepAbandoned``): nothing of it is left to skip,
    its next calls start the step again."""
    watch.script_skip = False
    watch.abandoning = 0


def recover_between_steps(engine, exc: BaseException) -> bool:
    """A call between the script's steps (its own collective, a checkpoint save) failed with
    ``exc``: when a lost peer is the cause, recover (the last completed step stands) and skip the
    script's collectives until its next step's forward. False: not a recoverable fault."""
    watch = engine._recovery.watch
    if watch is None or not peer_lost(exc) or not watch.wait_for_word():
        return False
    recover(engine, watch)
    watch.script_skip = True
    return True


def abandonable_save(engine, save):
    """``save()``, a checkpoint save, as the engine's own call: a peer lost during it is
    recovered, the save abandoned (False: ``latest`` moves only once every rank wrote) and
    training goes on."""
    with engine_call(engine):
        try:
            return save()
        except RuntimeError as exc:
            if not recover_between_steps(engine, exc):
                raise
            return False


def holds_live_state(engine) -> bool:
    """True (once) for a replacement that took the live state from its peers: the script's load
    at start must neither replace it nor make collectives they do not (a later load is the
    whole job's again)."""
    watch = engine._recovery.watch
    if watch is None or not watch.joined:
        return False
    watch.joined = False
    return True


def watch_script_collectives(engine) -> None:
    """Recover from faults in the script's own collectives too (the bootstrap's wrappers must be
    installed: they are whenever the agent keeps a progress record)."""
    torch_progress.SCRIPT_HOOKS = ScriptCollectives(engine)


def train_batch(engine, data_iter):
    """``engine.train_batch(data_iter)`` that survives a lost peer (the module docstring): the
    batch is run again after the recovery; returns its loss."""
    watch = engine._recovery.watch
    watch.script_skip = False  # a step starts: the script's collectives count again
    items = pipe.Replay(data_iter) if data_iter is not None else None
    step = engine.global_steps
    while True:
        with engine_call(engine):
            try:
                return engine._run_batch(items)
            except RuntimeError as exc:
                if not peer_lost(exc) or not watch.wait_for_word():
                    raise
                recover(engine, watch)  # (refuses when the members are not all at one step)
        if engine.global_steps != step:  # past this rank's update (its last sends' wait): the
            return engine._batch_loss    # batch stands on every member
        if items is not None:
            items.rewind()
