"""How swap files are laid out and moved: 4 KiB-aligned ranges, read and written through one
``AsyncIOHandle`` built from the config's typed ``aio`` section.

Shared by the swapped optimizer (``optimizer.py``, ``masters.py``) and the stage 3 parameter store
(``param_store.py``).
"""

from __future__ import annotations

ALIGN = 4096  # every range starts on a page, so each transfer can be one O_DIRECT request
AIO_KEYS = ("block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")


def round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def aio_settings(aio) -> dict:
    """The config's typed ``aio`` section as AsyncIOHandle arguments."""
    return {k: getattr(aio, k) for k in AIO_KEYS}


def open_aio_handle(aio: dict | None, key: str):
    """An ``AsyncIOHandle`` from ``aio`` (its keyword arguments); errors name ``key``'s device or
    the ``aio`` section."""
    # imported on use, as before: importing the engine does not load the aio module
    from dslaunch.nvme.aio import AioUnavailable, AsyncIOHandle

    try:
        return AsyncIOHandle(**(aio or {}))
    except AioUnavailable as exc:
        raise RuntimeError(f"{key}.device: nvme offload needs the async_io op: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"aio: {exc}") from None
