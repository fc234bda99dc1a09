"""The straggler report: which ranks are slow, and where their extra time goes.

In synchronous training every rank's wall-clock step time is the same: each waits in the
collectives for the slowest. So a rank is judged by the part of its step it controls, its
**compute** (the step's time outside collectives, ``jobview.py``): a straggler's compute per step
is more than ``threshold`` (a fraction: 0.2 = 20 %) above the median of all ranks. A rank whose
wall-clock step time is that far above the median is one too (ranks that do not step in lockstep).
Its extra time is "compute" when its compute exceeds the median by more than its time in
collectives does, else "collectives" (its own communication is slow, e.g. a slow link when others
do not wait for it). The other ranks' time in collectives is what they lose waiting for it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dslaunch.launcher.text_table import text_table

DEFAULT_THRESHOLD = 0.2


@dataclass
class Straggler:
    rank: int
    host: str
    compute: float
    step_time: float
    collectives: float
    median_compute: float
    median_step_time: float
    median_collectives: float
    extra_in: str  # "compute" or "collectives"

    @property
    def extra(self) -> float:
        return self.compute - self.median_compute


def find(rows: list, threshold: float = DEFAULT_THRESHOLD) -> list:
    """The stragglers among ``rows`` (dicts with rank, host, step_time, collectives, compute;
    ranks without figures are left out), slowest first."""
    rows = [r for r in rows if r.get("step_time") is not None]
    if len(rows) < 2:
        return []
    med_compute = statistics.median(r["compute"] for r in rows)
    med_step = statistics.median(r["step_time"] for r in rows)
    med_coll = statistics.median(r["collectives"] for r in rows)
    found = []
    for r in rows:
        if r["compute"] > med_compute * (1 + threshold) or r["step_time"] > med_step * (1 + threshold):
            extra_in = ("compute" if r["compute"] - med_compute >= r["collectives"] - med_coll
                        else "collectives")
            found.append(Straggler(r["rank"], r["host"], r["compute"], r["step_time"],
                                   r["collectives"], med_compute, med_step, med_coll, extra_in))
    return sorted(found, key=lambda s: s.compute - s.median_compute, reverse=True)


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def report(rows: list, threshold: float = DEFAULT_THRESHOLD) -> str:
    """The report's text: one line per rank (step time, compute, in collectives per step), then
    a verdict line per straggler, or that there is none."""
    known = [r for r in rows if r.get("step_time") is not None]
    if len(known) < 2:
        return ("straggler report: not enough data yet (needs at least two ranks that have "
                "finished a step since the first)")
    steps = [(r.get("first_step"), r.get("last_step")) for r in known if r.get("first_step") is not None]
    span = f", steps {min(a for a, _ in steps)}-{max(b for _, b in steps)}" if steps else ""
    lines = [f"straggler report (per step{span}; a straggler's compute is more than "
             f"{threshold:.0%} above the median):"]
    found = find(known, threshold)
    named = {s.rank for s in found}
    table = [("rank", "host", "step time", "compute", "in collectives", "")]
    for r in sorted(known, key=lambda r: r["rank"]):
        table.append((r["rank"], r["host"], _s(r["step_time"]), _s(r["compute"]),
                      _s(r["collectives"]), "<- straggler" if r["rank"] in named else ""))
    lines += text_table(table, align="><>>>", indent="  ")
    if not found:
        med = statistics.median(r["compute"] for r in known)
        lines.append(f"no straggler: every rank's compute per step is within {threshold:.0%} of "
                     f"the median ({_s(med)})")
        return "\n".join(lines)
    others = [r for r in known if r["rank"] not in named]
    waiting = statistics.median(r["collectives"] for r in others) if others else None
    for s in found:
        pct = f", +{s.extra / s.median_compute:.0%}" if s.median_compute > 0 else ""
        line = (f"straggler: rank {s.rank} ({s.host}): compute {_s(s.compute)} per step, median "
                f"{_s(s.median_compute)} (+{_s(max(s.extra, 0.0))}{pct}); its extra time is "
                f"{s.extra_in}")
        if s.extra_in == "compute" and waiting is not None:
            line += (f"; the other ranks wait for it in collectives ({_s(waiting)} per step, "
                     f"median)")
        elif s.extra_in == "collectives":
            line += (f" ({_s(s.collectives)} per step in collectives, median "
                     f"{_s(s.median_collectives)})")
        lines.append(line)
    return "\n".join(lines)
