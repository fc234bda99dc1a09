"""Small helpers DeepSpeed scripts call from ``deepspeed.runtime.utils``: print the memory in use
(``see_memory_usage``), seed every generator (``set_random_seed``), move nested tensors
(``move_to_device``). Public as ``dslaunch.runtime.utils``."""

from __future__ import annotations

import gc
import random

import torch
import torch.distributed as dist


def see_memory_usage(message: str, force: bool = False) -> None:
    """With ``force``, global rank 0 prints ``message`` and the accelerator's memory in use and
    at peak (on the CPU: the process's RSS and its peak), then resets the peak; without it,
    nothing (DeepSpeed's calls sit in hot paths, switched on by ``force``)."""
    if not force or (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        return
    from dslaunch.accelerator import get_accelerator

    acc = get_accelerator()
    gc.collect()
    gib = 2.0**30
    print(f"[dslaunch] {message} | MA {acc.memory_allocated() / gib:.2f} GB | Max_MA "
          f"{acc.max_memory_allocated() / gib:.2f} GB | CA {acc.memory_reserved() / gib:.2f} GB | "
          f"Max_CA {acc.max_memory_reserved() / gib:.2f} GB", flush=True)
    acc.reset_peak_memory_stats()


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator (when numpy is installed) and torch's
    (every device)."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


def move_to_device(item, device, criterion_func=None):
    """``item`` with the tensors in it (nested in lists, tuples and dicts) moved to ``device``;
    with ``criterion_func``, only the tensors for which it returns True. Containers are rebuilt,
    anything else is returned as it is."""
    if torch.is_tensor(item):
        return item.to(device) if criterion_func is None or criterion_func(item) else item
    if isinstance(item, (list, tuple)):
        moved = [move_to_device(v, device, criterion_func) for v in item]
        if isinstance(item, tuple) and hasattr(item, "_fields"):  # a namedtuple
            return type(item)(*moved)
        return type(item)(moved)
    if isinstance(item, dict):
        return type(item)((k, move_to_device(v, device, criterion_func)) for k, v in item.items())
    return item
