"""dslaunch's logger (DeepSpeed's ``deepspeed.utils.logger`` / ``log_dist``).

One ``logging.Logger`` named ``"dslaunch"``: frameworks quiet or raise it with
``logger.setLevel(...)`` as they do DeepSpeed's. It writes to stdout with its own handler and does
not propagate, so a root logger configured by the application does not print each line twice.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("dslaunch")
if not logger.handlers:  # once per process, even if this module is reloaded
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [dslaunch] "
                                            "%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log ``message`` as ``[Rank r] message`` on the listed ranks, DeepSpeed's rule: outside a
    distributed job always; inside one, only on a rank in ``ranks`` (``[-1]``: every rank;
    ``None`` or ``[]``: none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        wanted = list(ranks or [])
        if not (-1 in wanted or rank in wanted):
            return
    else:
        rank = -1
    logger.log(level, f"[Rank {rank}] {message}")
