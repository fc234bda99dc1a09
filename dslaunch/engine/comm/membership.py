"""Who this process is in the job, for in-process recovery: a standby waiting to be promoted, a
replacement rank that builds alone before it joins, and what a collective raises when a peer is
gone. Below ``comm``: process-group set-up, the grid and the engine read it; the recovery itself
(``engine/recovery/``) is above them all and is handed to the engine by ``initialize``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from dslaunch import standby_priority
from dslaunch.recover_files import JOIN_ENV, STANDBY_ENV, read_json

# what a collective raises when a peer is gone or its connections were shut (gloo, NCCL)
_FAULT_WORDS = ("connection closed", "connection reset", "broken pipe", "timed out", "gloo",
                "nccl", "socket", "peer")


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
    prewarm()
    while (word := read_json(path)) is None:
        time.sleep(0.01)
    os.environ.update(word["env"])
    del os.environ[STANDBY_ENV]
    standby_priority.restore()
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
