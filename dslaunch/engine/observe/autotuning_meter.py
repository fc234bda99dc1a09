"""The engine's side of an autotuning trial (``dslaunch autotune``, ``dslaunch/autotune/``).

A trial's config has ``autotuning.enabled`` and ``autotuning.metric_path`` (the tuner writes
both). The engine then times the optimizer steps after ``start_profile_step`` up to
``end_profile_step`` (synchronising the device at both ends, so queued kernels are counted),
rank 0 writes the metrics as JSON to ``metric_path`` and every rank exits with status 0, as
DeepSpeed's engine does. The same JSON goes to stdout on one line (``LOG_PREFIX``), so a tuner on another host reads it
from the job's output. A config with ``autotuning.enabled`` but no ``metric_path`` (the file a
user hands to ``dslaunch autotune``) trains normally: the section only steers the tuner.

Metrics (all from the measured window of ``end - start`` steps):
- ``latency``: seconds per optimizer step;
- ``throughput``: samples per second (``train_batch_size / latency``, DeepSpeed's);
- ``tokens_per_sec``: token ids the forward passes saw, all data-parallel ranks;
- ``flops``: per rank, estimated as ``6 x parameters x tokens/s / ranks`` (forward + backward
  of a dense model): the same model on every trial, so it ranks trials as throughput does.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

LOG_PREFIX = "[dslaunch] autotuning metrics: "


class TrialMeter:
    def __init__(self, section, num_params: int, device: torch.device):
        self.start = section.start_profile_step
        self.end = section.end_profile_step
        self.path = section.metric_path
        self.num_params = num_params
        self.device = device
        self._t0 = None
        self._tokens0 = 0

    @classmethod
    def from_config(cls, cfg, model, device):
        section = cfg.autotuning
        if section is None or not section.enabled or not section.metric_path:
            return None
        # ds_numel: a parameter ZeRO-3 has already partitioned still counts whole
        num = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
        return cls(section, num, device)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def after_step(self, engine) -> None:
        """Called once per optimizer step, after ``global_steps`` advanced."""
        step = engine.global_steps
        if step == self.start:
            self._sync()
            self._t0, self._tokens0 = time.perf_counter(), engine._tokens
        elif step >= self.end and self._t0 is not None:
            self._sync()
            elapsed = max(time.perf_counter() - self._t0, 1e-9)
            steps = step - self.start
            latency = elapsed / steps
            tokens = (engine._tokens - self._tokens0) * engine.dp_world_size
            metrics = {
                "latency": latency,
                "throughput": engine.train_batch_size() / latency,
                "tokens_per_sec": tokens / elapsed,
                "flops": 6.0 * self.num_params * tokens / elapsed / max(engine.world_size, 1),
                "steps_measured": steps,
                "train_batch_size": engine.train_batch_size(),
                "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
                "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
                "zero_stage": engine.zero_stage,
                "num_params": self.num_params,
                "peak_device_memory": (torch.cuda.max_memory_allocated(self.device)
                                       if self.device.type == "cuda" else -1),
            }
            if engine.global_rank == 0:
                tmp = f"{self.path}.tmp"
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                with open(tmp, "w") as f:
                    json.dump(metrics, f, indent=2)
                os.replace(tmp, self.path)  # the tuner never reads half a file
                # also on stdout, which the launcher brings back from any host: the tuner reads
                # it from the job's log when metric_path is on a disk it does not see
                print(f"{LOG_PREFIX}{json.dumps(metrics)}", flush=True)
            if engine._async_saver is not None:  # a background save finishes first
                engine.wait_checkpoint()
            sys.stdout.flush()
            sys.exit(0)
