"""DeepSpeed's ``elasticity`` section: one global batch size that many world sizes can train with,
so a job restarted on fewer (or more) ranks keeps the same ``train_batch_size`` and only the
micro-batch size and gradient accumulation change.

The solver follows DeepSpeed's (``deepspeed/elasticity/elasticity.py``, versions 0.1 and 0.2),
written anew:

- candidates: each micro-batch size, and their least common multiple, scaled by the largest
  highly composite number (many divisors: many world sizes) that keeps it within
  ``max_train_batch_size``;
- a world size ``n`` fits a batch ``B`` when some micro-batch size ``m`` divides ``B`` and
  ``n`` divides ``B / m`` (gradient accumulation takes the rest), within
  ``[min_gpus, max_gpus]``;
- the candidate that most world sizes fit wins; ties go to the larger batch
  (``prefer_larger_batch``, the default) or the smaller.
- version 0.2 counts in nodes (``num_gpus_per_node``, ``model_parallel_size``: data-parallel
  ranks per node) and, as DeepSpeed does, gives a world size outside the list a batch of its
  own (the largest multiple of ``micro * dp`` within ``max_train_batch_size``): the global batch
  then differs, which the resolution notes.

Where dslaunch is stricter than DeepSpeed: a data-parallel size outside ``[min_gpus, max_gpus]``
is refused in version 0.2 too, and no candidate batch exceeds ``max_train_batch_size``.
``min_time`` (a hint for schedulers) is accepted and unused. Pure data: no torch.
"""

from __future__ import annotations

import math
from typing import Optional

from .batch import GAS, MBS, TBS, TRIAD

KEY = "elasticity"


def _highly_composite(limit: int) -> list:
    """Highly composite numbers <= ``limit`` (each has more divisors than every smaller number),
    enumerated as products of the first primes with non-increasing exponents."""
    primes = (2, 3, 5, 7, 11, 13, 17, 19, 23)
    found = []  # (value, divisor count)

    def walk(i, value, divisors, max_exp):
        found.append((value, divisors))
        if i == len(primes):
            return
        v, e = value, 0
        while e < max_exp and v * primes[i] <= limit:
            v, e = v * primes[i], e + 1
            walk(i + 1, v, divisors * (e + 1), e)

    walk(0, 1, 1, 64)
    out, best = [], 0
    for value, divisors in sorted(found):
        if divisors > best:
            out.append(value)
            best = divisors
    return out


def _candidates(micro: list, max_batch: int) -> list:
    bases = sorted(set(micro) | {math.lcm(*micro)})
    out = set()
    for base in bases:
        if base > max_batch:
            continue
        scale = max(h for h in _highly_composite(max_batch // base))
        out.add(base * scale)
    return sorted(out)


def fitting_sizes(batch: int, micro: list, lo: int, hi: int) -> list:
    """Data-parallel sizes in [lo, hi] that ``batch`` splits into: some micro-batch size m with
    m | batch and n | batch / m."""
    sizes = set()
    for m in micro:
        if batch % m == 0:
            per = batch // m
            sizes.update(n for n in range(max(lo, 1), min(hi, per) + 1) if per % n == 0)
    return sorted(sizes)


def solve_v01(micro: list, max_batch: int, min_gpus: int, max_gpus: int,
              prefer_larger: bool) -> tuple:
    """``(train_batch_size, valid data-parallel sizes)``; the list is empty when none fits."""
    best_batch, best_sizes = None, []
    for batch in _candidates(micro, max_batch):
        sizes = fitting_sizes(batch, micro, min_gpus, max_gpus)
        better = len(sizes) > len(best_sizes) or (
            len(sizes) == len(best_sizes) and sizes and best_batch is not None
            and (batch > best_batch if prefer_larger else batch < best_batch))
        if better or best_batch is None:
            best_batch, best_sizes = batch, sizes
    return best_batch, best_sizes


def pick_micro(batch: int, dp: int, micro: list, largest: bool) -> Optional[int]:
    """The micro-batch size a data-parallel rank runs: ``batch / dp`` must be a multiple of it.
    ``largest``: the largest that fits, else the first in the list's order (DeepSpeed's)."""
    if batch % dp:
        return None
    fits = [m for m in micro if (batch // dp) % m == 0]
    if not fits:
        return None
    return max(fits) if largest else fits[0]


class Elastic:
    """The solved section: ``train_batch_size``, ``valid_sizes`` (data-parallel sizes that keep
    it), and per data-parallel size ``split(dp) -> (micro, gas, batch)`` or a refusal."""

    def __init__(self, sec: dict):
        self.sec = sec
        self.micro = list(sec["micro_batch_sizes"])
        self.version = float(sec["version"])
        prefer = bool(sec["prefer_larger_batch"])
        max_batch = int(sec["max_train_batch_size"])
        if self.version == 0.1:
            self.per_node = 1
            self.batch, self.valid_sizes = solve_v01(self.micro, max_batch, sec["min_gpus"],
                                                     sec["max_gpus"], prefer)
        else:  # 0.2: counted in nodes of num_gpus_per_node / model_parallel_size dp ranks
            gpn = int(sec["num_gpus_per_node"])
            self.per_node = gpn // int(sec["model_parallel_size"])
            nodes_batch, nodes = solve_v01(self.micro, max_batch // self.per_node,
                                           max(1, sec["min_gpus"] // gpn),
                                           sec["max_gpus"] // gpn, prefer)
            self.batch = (nodes_batch or 0) * self.per_node
            self.valid_sizes = [n * self.per_node for n in nodes]

    def describe(self) -> str:
        return (f"valid data-parallel sizes for train_batch_size {self.batch}: {self.valid_sizes}"
                f" (elasticity.max_train_batch_size {self.sec['max_train_batch_size']}, "
                f"micro_batch_sizes {self.micro}, min_gpus {self.sec['min_gpus']}, max_gpus "
                f"{self.sec['max_gpus']}, version {self.sec['version']})")

    def split(self, dp: int) -> tuple:
        """``(micro, gas, train_batch_size, problem)`` for ``dp`` data-parallel ranks."""
        sec = self.sec
        if not sec["min_gpus"] <= dp <= sec["max_gpus"]:
            return None, None, None, (
                f"{KEY}: data-parallel size {dp} is outside elasticity.min_gpus.."
                f"max_gpus [{sec['min_gpus']}, {sec['max_gpus']}]; {self.describe()}")
        if dp in self.valid_sizes:
            micro = pick_micro(self.batch, dp, self.micro,
                               self.version == 0.1 or sec["prefer_larger_batch"])
            return micro, self.batch // (micro * dp), self.batch, None
        if self.version == 0.1:
            return None, None, None, (
                f"{KEY}: data-parallel size {dp} cannot keep the elastic batch; "
                f"{self.describe()}; run on one of them or change elasticity.micro_batch_sizes")
        # 0.2, as DeepSpeed: a batch of this size's own, the largest within max_train_batch_size
        max_batch = int(sec["max_train_batch_size"])
        options = [(max_batch // (m * dp)) * m * dp for m in self.micro]
        batch = max(options) if sec["prefer_larger_batch"] else min(options)
        micro = pick_micro(batch, dp, self.micro, sec["prefer_larger_batch"]) if batch else None
        if not micro:
            return None, None, None, (
                f"{KEY}: data-parallel size {dp} times the smallest micro-batch size "
                f"{min(self.micro)} exceeds elasticity.max_train_batch_size {max_batch}; "
                f"{self.describe()}")
        return micro, batch // (micro * dp), batch, None


def _section_problems(sec: dict) -> list:
    if float(sec["version"]) not in (0.1, 0.2):
        return [f"{KEY}.version: {sec['version']} is not a solver version; use 0.1 or 0.2"]
    problems = []
    if sec.get("max_train_batch_size") is None:
        problems.append(f"{KEY}.max_train_batch_size: missing; elastic training needs the "
                        "largest train_batch_size it may choose")
    micro = sec.get("micro_batch_sizes")
    if micro is None:
        problems.append(f"{KEY}.micro_batch_sizes: missing; list the micro-batch sizes per GPU "
                        "that fit in memory, e.g. [2, 4]")
    elif not (isinstance(micro, list) and micro and all(
            isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in micro)):
        problems.append(f"{KEY}.micro_batch_sizes: {micro!r} is not a list of positive integers")
    elif sec.get("max_train_batch_size") is not None and max(micro) > sec["max_train_batch_size"]:
        problems.append(f"{KEY}.micro_batch_sizes: {max(micro)} is larger than "
                        f"elasticity.max_train_batch_size {sec['max_train_batch_size']}")
    if sec["max_gpus"] < sec["min_gpus"]:
        problems.append(f"{KEY}.max_gpus: {sec['max_gpus']} is below min_gpus "
                        f"{sec['min_gpus']}")
    if float(sec["version"]) == 0.2 and sec["num_gpus_per_node"] % sec["model_parallel_size"]:
        problems.append(f"{KEY}.num_gpus_per_node: {sec['num_gpus_per_node']} is not a multiple "
                        f"of elasticity.model_parallel_size {sec['model_parallel_size']}")
    if float(sec["version"]) == 0.1 and sec["model_parallel_size"] > 1:
        problems.append(f"{KEY}.model_parallel_size: needs elasticity.version 0.2")
    return problems


def resolve_elastic(values: dict, sources: dict, problems: list, notes: list,
                    dp: Optional[int]) -> None:
    """Fill the batch triad from the enabled ``elasticity`` section (in place), or append why
    it cannot be. ``dp`` None: only ``train_batch_size`` is fixed; a note lists the sizes."""
    sec = values[KEY]
    found = _section_problems(sec)
    written = [k for k in TRIAD if sources.get(k) == "file"]
    if written and not sec["ignore_non_elastic_batch_info"]:
        found.append(f"{written[0]}: set in the config, but elastic training computes the batch "
                     f"sizes ({', '.join(written)} would not be used); remove them or set "
                     "elasticity.ignore_non_elastic_batch_info true")
    if found:
        problems.extend(found)
        return
    solved = Elastic(sec)
    if not solved.valid_sizes and (solved.version == 0.1 or dp is None):
        problems.append(f"{KEY}: no data-parallel size in elasticity.min_gpus..max_gpus "
                        f"[{sec['min_gpus']}, {sec['max_gpus']}] divides any batch up to "
                        f"max_train_batch_size {sec['max_train_batch_size']} with micro_batch_sizes "
                        f"{solved.micro}")
        return
    for k in TRIAD:
        sources[k] = "inferred"
    if dp is None:
        values[TBS], values[MBS], values[GAS] = solved.batch, None, None
        notes.append(f"{MBS} and {GAS} depend on the world size ({KEY}); {solved.describe()}")
        return
    micro, gas, batch, problem = solved.split(dp)
    if problem:
        problems.append(problem)
        return
    if batch != solved.batch:
        notes.append(f"{TBS}: {batch} at data-parallel size {dp}, not the elastic {solved.batch}"
                     f" ({KEY} version 0.2 gives a size outside {solved.valid_sizes} its own)")
    values[TBS], values[MBS], values[GAS] = batch, micro, gas


def elastic_sizes(values: dict) -> Optional[list]:
    """The data-parallel sizes an enabled ``elasticity`` section keeps the batch for (None when
    it is off or invalid): for a launcher choosing how many ranks to restart with."""
    sec = values.get(KEY) or {}
    if not sec.get("enabled") or _section_problems(sec):
        return None
    return Elastic(sec).valid_sizes
