"""Bytes of model state a rank holds, by kind and by device.

``tally`` counts each storage once (views of one flat buffer, tied weights and a tensor listed
twice are not double-counted), so the numbers are what the process really holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import torch

KINDS = ("params", "grads", "optimizer")


def _storage_key(t: torch.Tensor):
    try:
        s = t.untyped_storage()
        return (s.data_ptr(), t.device.type, s.nbytes())
    except (RuntimeError, NotImplementedError):  # meta / fake tensors hold nothing
        return None


def tally(tensors: Iterable[torch.Tensor], seen: set | None = None) -> dict:
    """{device_type: bytes} of the distinct storages behind ``tensors``; ``seen`` (shared between
    calls) keeps a storage from being counted under two kinds."""
    seen = set() if seen is None else seen
    out: dict = defaultdict(int)
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        key = _storage_key(t)
        if key is None or key[1] == "meta" or key in seen:
            continue
        seen.add(key)
        out[t.device.type] += key[2]
    return dict(out)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list:
    """Every tensor in the optimizer's per-parameter state (exp_avg, exp_avg_sq, step, ...)."""
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


def breakdown(params, grads, optimizer_tensors) -> dict:
    """{"params": {device: bytes}, "grads": {...}, "optimizer": {...}, "total": {...}}; storages
    are attributed to the first kind that lists them, in that order."""
    seen: set = set()
    result = {"params": tally(params, seen), "grads": tally(grads, seen),
              "optimizer": tally(optimizer_tensors, seen)}
    total: dict = defaultdict(int)
    for kind in KINDS:
        for dev, n in result[kind].items():
            total[dev] += n
    result["total"] = dict(total)
    return result
