"""Who this process is in the job, for in-process recovery: a standby waiting to be promoted, a
replacement rank that builds alone before it joins, and what a collective raises when a peer is
gone. Below ``comm``: process-group set-up, the grid and the engine read it; the recovery itself
(``engine/recovery/``) is above them all and is handed to the engine by ``initialize``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from dslaunch import standby_priority
from dslaunch.recover_files import JOIN_ENV, STANDBY_ENV, read_json

# what a collective raises when a peer is gone or its connections were shut (gloo, NCCL)
_FAULT_WORDS = ("connection closed", "connection reset", "broken pipe", "timed out", "gloo",
                "nccl", "socket", "peer")


class StepAbandoned(RuntimeError):
    """Raised to the script, under ``dslaunch run --recover in-process``, by a call whose result the
    fault-free run would not have given: the script's own collective that a lost peer interrupted
    (or one it makes later in the step the recovery abandoned), or a forward that would have to run
    without its collectives (ZeRO 3's gathers, AutoTP's). The peer is replaced and the training
    state is the last completed step's: catch it and go on to the loop's next iteration, which runs
    that step again (docs/resilience.md, "The script's own collectives")."""


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a collective, says a peer was lost (not a usage error)."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _FAULT_WORDS)


def _prewarm_compiler() -> None:
    try:  # only a head start: the real import reports any error
        import torch._dynamo  # noqa: F401
    except Exception:
        pass


def await_promotion(prewarm=_prewarm_compiler) -> None:
    """A standby process (the agent started it ahead of any fault) waits here, at dslaunch's first
    call, until it is promoted to a lost rank: then it takes that rank's environment and goes on
    as a replacement. ``prewarm`` runs first, while it waits: imports that are not on the
    recovery's path then (torch's compiler, which torch.optim's first Optimizer imports, is about
    4 s of the replacement's 4.6 s on this project's 2-core host; ``initialize`` adds the
    engine's modules)."""
    path = os.environ.get(STANDBY_ENV)
    if not path:
        return
    # The prewarm runs beside the wait, not before it: at the standby's lowered priority on a busy
    # host it could still be importing when the promotion came, and the promoted rank stayed at
    # that priority until it was done (a replacement that took more than the launcher's 90 s to
    # answer: the survivors waited for the new group's store, which it hosts). Promoted, every
    # thread takes the rank's priority back first; then the prewarm is waited for (two threads
    # importing the same modules at once can meet a half-made one).
    warm = threading.Thread(target=prewarm, name="dslaunch-standby-prewarm", daemon=True)
    warm.start()
    while (word := read_json(path)) is None:
        time.sleep(0.01)
    standby_priority.restore()
    warm.join()
    os.environ.update(word["env"])
    del os.environ[STANDBY_ENV]
    # a standby had no progress record, so the script's torch.distributed calls were not wrapped:
    # wrap them now (the hang watchdog, and recovery from a fault in a collective of the script's)
    from dslaunch import torch_progress

    torch_progress.install_on_import()
    injected = sys.modules.get("dslaunch.engine.base.fault_injection")
    if injected is not None:  # --inject after=: a promoted standby's life starts now
        injected.restart_clock()


def join_word() -> dict | None:
    """The instruction a replacement rank was started with (None: not a replacement)."""
    text = os.environ.get(JOIN_ENV)
    return json.loads(text) if text else None


def job_world_size() -> int:
    """The job's world size; for a replacement rank, built alone before it joins, the world it
    joins."""
    import torch.distributed as dist

    word = join_word()
    return int(word["world_size"]) if word else dist.get_world_size()


def init_private_world() -> None:
    """A replacement builds its engine alone first: a one-rank group on an in-memory store."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
