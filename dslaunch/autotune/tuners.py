"""Which experiment runs next, and when the search stops.

Every tuner sees the trials finished so far (``records``: name -> record, each with its run
``index``) and answers the next experiment, so a resumed search makes the same choices as an
uninterrupted one. Common to all:
- an experiment already recorded is never run again;
- after an out-of-memory trial, the larger micro-batches of its group (same stage and offload)
  are skipped: they hold more activations in the same model states;
- ``tuner_num_trials`` caps the trials run; ``tuner_early_stopping``: stop after that many trials
  in a row without a better metric than the best so far (DeepSpeed's rule).

The tuners:
- ``gridsearch``: every experiment, in grid order (stage, offload, micro-batch ascending);
- ``random``: every experiment in a random order (``--seed``);
- ``model_based``: a cost model in which a step's latency is affine in the micro-batch,
  ``a + b * mbs`` with both a fixed and a per-sample cost >= 0, separately for each group. Under
  it the throughput ``mbs / (a + b * mbs)`` only grows with the micro-batch, so a group's best
  throughput (or FLOPS) is at its largest micro-batch that fits, and its best latency at its
  smallest: the tuner measures that one point per group (the next size down after an OOM or a
  failure), groups in the order the memory estimator ranks them (least offload, lowest stage
  first), and stops early as above.
"""

from __future__ import annotations

import random

HIGHER_IS_BETTER = {"throughput": True, "flops": True, "latency": False}


def metric_value(record: dict, metric: str):
    if record.get("status") != "ok" or not record.get("metrics"):
        return None
    return record["metrics"].get(metric)


def better(a, b, metric: str) -> bool:
    """True when metric value ``a`` beats ``b`` (``b`` None: anything beats it)."""
    if a is None:
        return False
    if b is None:
        return True
    return a > b if HIGHER_IS_BETTER[metric] else a < b


def best_record(records: dict, metric: str):
    best = None
    for rec in sorted(records.values(), key=lambda r: r["index"]):
        if better(metric_value(rec, metric), metric_value(best, metric) if best else None, metric):
            best = rec
    return best


def oom_limit(records: dict, group: tuple):
    """The smallest micro-batch of ``group`` that ran out of memory (None: none did)."""
    sizes = [r["micro_batch"] for r in records.values()
             if r.get("status") == "oom" and tuple(r["group"]) == tuple(group)]
    return min(sizes) if sizes else None


class Tuner:
    def __init__(self, experiments: list, metric: str, early_stopping: int, num_trials: int,
                 seed: int = 0):
        self.experiments = list(experiments)
        self.metric = metric
        self.early_stopping = early_stopping
        self.num_trials = num_trials
        self.seed = seed

    def order(self) -> list:
        return self.experiments

    def _open(self, records: dict) -> list:
        """Experiments still to run, in this tuner's order."""
        out = []
        for exp in self.order():
            if exp.name in records:
                continue
            limit = oom_limit(records, exp.group)
            if limit is not None and exp.micro_batch > limit:
                continue
            out.append(exp)
        return out

    def skipped(self, records: dict) -> list:
        """[(experiment, reason)] never run because a smaller micro-batch ran out of memory."""
        out = []
        for exp in self.experiments:
            limit = oom_limit(records, exp.group)
            if exp.name not in records and limit is not None and exp.micro_batch > limit:
                out.append((exp, f"micro-batch {limit} of this group ran out of memory"))
        return out

    def stop_reason(self, records: dict):
        ran = sorted(records.values(), key=lambda r: r["index"])
        if len(ran) >= self.num_trials:
            return f"autotuning.tuner_num_trials ({self.num_trials}) reached"
        best, since = None, 0
        for rec in ran:
            value = metric_value(rec, self.metric)
            if better(value, best, self.metric):
                best, since = value, 0
            else:
                since += 1
        if best is not None and since >= self.early_stopping:
            return (f"autotuning.tuner_early_stopping: {since} trials without a better "
                    f"{self.metric}")
        return None

    def next(self, records: dict):
        """(experiment, None) to run next, or (None, why the search ends)."""
        reason = self.stop_reason(records)
        if reason:
            return None, reason
        candidates = self._pick(records)
        if not candidates:
            return None, "every experiment of the space is done"
        return candidates[0], None

    def _pick(self, records: dict) -> list:
        return self._open(records)


class GridSearchTuner(Tuner):
    pass


class RandomTuner(Tuner):
    def order(self) -> list:
        shuffled = list(self.experiments)
        random.Random(self.seed).shuffle(shuffled)
        return shuffled


class ModelBasedTuner(Tuner):
    def order(self) -> list:
        def rank(exp):
            offloads = (exp.offload_optimizer != "none") + (exp.offload_param != "none")
            size = -exp.micro_batch if HIGHER_IS_BETTER[self.metric] else exp.micro_batch
            return (offloads, exp.stage, exp.offload_optimizer, exp.offload_param, size)
        return sorted(self.experiments, key=rank)

    def _pick(self, records: dict) -> list:
        done = {tuple(r["group"]) for r in records.values() if r.get("status") == "ok"}
        return [e for e in self._open(records) if e.group not in done]

    def skipped(self, records: dict) -> list:
        out = super().skipped(records)
        done = {tuple(r["group"]) for r in records.values() if r.get("status") == "ok"}
        listed = {e.name for e, _ in out}
        for exp in self.experiments:
            if exp.name not in records and exp.name not in listed and exp.group in done:
                out.append((exp, "the cost model ranks it below its group's measured point"))
        return out


TUNERS = {"gridsearch": GridSearchTuner, "random": RandomTuner, "model_based": ModelBasedTuner}


def make_tuner(kind: str, experiments: list, section, seed: int = 0) -> Tuner:
    return TUNERS[kind](experiments, section.metric, section.tuner_early_stopping,
                        section.tuner_num_trials, seed)
