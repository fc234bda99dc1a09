"""Training monitors (CSV, TensorBoard; W&B and Comet in ``monitor_trackers.py``), the wall-clock
breakdown timers and the throughput timer.

Monitors receive events ``(name, value, step)`` from rank 0 after each optimizer step, with
DeepSpeed's names: ``Train/Samples/train_loss``, ``Train/Samples/lr``,
``Train/Samples/loss_scale`` (step = global samples). CSV: one file per event under
``<output_path>/<job_name>/``, named after the event with "/" -> "_", columns ``step,<last part of
the name>``. TensorBoard: ``SummaryWriter(<output_path>/<job_name>)``; the ``tensorboard``
package is optional and enabling it without the package is a clear error.
"""

from __future__ import annotations

import csv
import os
import time
from collections import defaultdict


class CSVMonitor:
    def __init__(self, output_path: str, job_name: str):
        self.dir = os.path.join(output_path or "csv_monitor", job_name or "DeepSpeedJobName")
        os.makedirs(self.dir, exist_ok=True)

    def write_events(self, events) -> None:
        for name, value, step in events:
            path = os.path.join(self.dir, name.replace("/", "_") + ".csv")
            new = not os.path.exists(path)
            with open(path, "a", newline="") as f:
                w = csv.writer(f)
                if new:
                    w.writerow(["step", name.split("/")[-1]])
                w.writerow([step, value])

    def close(self) -> None:
        pass


class TensorBoardMonitor:
    def __init__(self, output_path: str, job_name: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's module needs the tensorboard package
            raise RuntimeError(
                "tensorboard.enabled: the tensorboard package is not installed; "
                "`pip install tensorboard` or disable the tensorboard section") from e
        self.writer = SummaryWriter(os.path.join(output_path or "runs", job_name or
                                                 "DeepSpeedJobName"))

    def write_events(self, events) -> None:
        for name, value, step in events:
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Monitors:
    """All enabled monitors; only rank 0 writes."""

    def __init__(self, cfg, rank: int):
        """``cfg``: the typed config; its ``csv_monitor``, ``tensorboard``, ``wandb`` and
        ``comet`` sections say which monitors run (the last two: ``monitor_trackers.py``)."""
        self.monitors = []
        if rank != 0:
            return
        for section, cls in ((cfg.csv_monitor, CSVMonitor), (cfg.tensorboard, TensorBoardMonitor)):
            if section.enabled:
                self.monitors.append(cls(section.output_path, section.job_name))
        if cfg.wandb.enabled or cfg.comet.enabled:
            from dslaunch.engine.observe.monitor_trackers import CometMonitor, WandbMonitor

            for section, cls in ((cfg.wandb, WandbMonitor), (cfg.comet, CometMonitor)):
                if section.enabled:
                    self.monitors.append(cls(section))

    @property
    def enabled(self) -> bool:
        return bool(self.monitors)

    def write_events(self, events) -> None:
        for m in self.monitors:
            m.write_events(events)

    def close(self) -> None:
        for m in self.monitors:
            m.close()
        self.monitors = []


class WallClock:
    """Accumulated milliseconds per phase (forward, backward, allreduce, step) between reports."""

    PHASES = ("forward", "backward", "allreduce", "step")

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.ms: dict = defaultdict(float)
        self.counts: dict = defaultdict(int)
        self._t0: dict = {}

    def start(self, name: str) -> None:
        if self.enabled:
            self._t0[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        if self.enabled and name in self._t0:
            self.ms[name] += (time.perf_counter() - self._t0.pop(name)) * 1e3
            self.counts[name] += 1

    def add(self, name: str, ms: float) -> None:
        if self.enabled:
            self.ms[name] += ms
            self.counts[name] += 1

    def report(self) -> str:
        """Mean ms per call of each phase since the last report, then reset."""
        parts = [f"{k}: {self.ms[k] / max(1, self.counts[k]):.2f}" for k in self.PHASES
                 if self.counts[k]]
        self.ms.clear()
        self.counts.clear()
        return "time (ms) | " + " | ".join(parts)


class ThroughputTimer:
    """DeepSpeed's ``engine.tput_timer``: training samples per second, timed from each forward to
    the ``step()`` that follows it (data loading between steps is not counted) and averaged over
    the optimizer steps after the first ``start_step`` (warm-up: compilation, allocator).
    ``update_epoch_count()`` counts epochs, as DeepSpeed-Chat's loops call it."""

    def __init__(self, batch_size: int, start_step: int = 2):
        self.batch_size = batch_size  # samples per optimizer step (the global batch)
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0  # seconds of the steps after start_step
        self._started = None

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        if self._started is None:  # a second forward before step() belongs to the same span
            self._started = time.perf_counter()

    def stop(self, global_step: bool = False) -> None:
        if self._started is None:
            return
        elapsed, self._started = time.perf_counter() - self._started, None
        self.micro_step_count += 1
        step = self.global_step_count + 1  # the optimizer step this micro-step belongs to
        if global_step:
            self.global_step_count = step
        if step > self.start_step:
            self.total_elapsed_time += elapsed

    def avg_samples_per_sec(self) -> float:
        """-inf until a step past the warm-up was timed (DeepSpeed answers the same)."""
        steps = self.global_step_count - self.start_step
        if steps <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / steps)
