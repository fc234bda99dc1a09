"""``--bind_cores_to_rank`` / ``--bind_core_list``: which CPU cores each rank of a host is pinned to.

The cores to share (the list given, else the cores this agent may run on) are split into equal,
contiguous blocks in local-rank order, as DeepSpeed's launcher splits them; cores left over by the
division stay unused. The rank is pinned by its bootstrap (``--cpus``) before the script starts, so
every thread it creates (OpenMP, torch's intra-op pool) inherits the set, and OMP_NUM_THREADS is the
block's size. Memory is not bound to a NUMA node (DeepSpeed uses numactl for that; we need no
numactl on the hosts).
"""

from __future__ import annotations

import os


class CoreListError(ValueError):
    """A ``--bind_core_list`` that cannot be used; the message says why."""


def parse_core_list(text: str) -> list[int]:
    """``"0,2-4,7"`` -> ``[0, 2, 3, 4, 7]`` (sorted, duplicates removed)."""
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo, 10), int(hi if dash else lo, 10)
        except ValueError:
            raise CoreListError(f"--bind_core_list {text!r}: {part!r} is not a core number or a "
                                "range like 2-5") from None
        if first < 0 or last < first:
            raise CoreListError(f"--bind_core_list {text!r}: bad range {part!r}")
        cores.update(range(first, last + 1))
    return sorted(cores)


def available_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def rank_cores(local_rank: int, local_ranks: int, core_list: str | None = None) -> list[int]:
    """The cores of one local rank; CoreListError when there are fewer cores than ranks."""
    cores = parse_core_list(core_list) if core_list else available_cores()
    per = len(cores) // local_ranks
    if per < 1:
        raise CoreListError(f"--bind_cores_to_rank: {local_ranks} ranks on this host but only "
                            f"{len(cores)} core(s) to share ({format_cores(cores)})")
    return cores[local_rank * per:(local_rank + 1) * per]


def format_cores(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the form taskset and --bind_core_list use)."""
    parts, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)
