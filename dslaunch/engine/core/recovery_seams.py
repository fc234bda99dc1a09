"""The seams where the engine hands a call to in-process recovery, and what they do when recovery
is off (``NoRecovery``: each runs the call as it is). ``initialize`` builds the recovery of this
rank (``engine/recovery/inprocess.py``, a subclass) and hands it to the engine; the engine and the
pipeline engine call it at forward, backward, step, train_batch, a checkpoint's save and load,
and import nothing of recovery.
"""

from __future__ import annotations

import contextlib


class NoRecovery:
    """In-process recovery off (the default): a lost peer fails the call, and the launcher stops
    or restarts the job."""

    def attach(self, engine) -> None:
        """The engine is built (its strategy and groups exist)."""

    def start(self, engine) -> None:
        """``initialize`` is about to return the engine to the script."""

    def forward_starts(self) -> None:
        """A forward starts: the script's next step."""

    def forward(self, engine, fn):
        return fn()

    def backward(self, engine, fn, *args):
        return fn(*args)

    def step(self, engine, fn, *args):
        return fn(*args)

    def train_batch(self, engine, data_iter):
        return engine._run_batch(data_iter)

    def save(self, engine, save):
        """``save()``, a checkpoint's: its result."""
        return save()

    def holds_live_state(self, engine) -> bool:
        """True when the script's checkpoint load must be skipped (a replacement that took the
        live state from its peers)."""
        return False

    def engine_call(self, engine):
        """The context of an engine call whose collectives are the engine's own (a load, an
        evaluation), not the script's."""
        return contextlib.nullcontext()
