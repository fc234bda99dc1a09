"""The engine's FLOPs: the ``flops_profiler`` config section's profiled step, and the achieved
TFLOPS / MFU on every ``steps_per_print`` line.

- Profiled step: at the forward where ``global_steps == profile_step`` (DeepSpeed's trigger),
  global rank 0 profiles every module of that step's forwards (``profiling/flops_profiler.py``),
  times forward, backward and step with the device synchronised, and prints
  the summary and module tree to the log (or writes ``output_file``) when the step ends.
- MFU: the engine's first forward is counted (operators only, hooks on the root module for that
  call only, no synchronisation; not for a ``torch.compile``'d module, whose line then shows no
  MFU) to learn the forward
  FLOPs per token (per forward call when the input is not token ids). A training step does
  ``3 + recompute_fwd_factor`` times that (backward is twice the forward); the print line
  divides the FLOPs since the last print by the seconds, and by the device's peak
  (``profiling/peak.py``) for MFU.
"""

from __future__ import annotations

import time

import torch


class EngineFlops:
    def __init__(self, engine, cfg_profiler):
        self.engine = engine
        self.cfg = cfg_profiler
        self.profile_enabled = bool(cfg_profiler.enabled)
        self.recompute = float(cfg_profiler.recompute_fwd_factor or 0.0)
        self.profiler = None  # the FlopsProfiler while the profiled step runs
        self._t0 = 0.0
        self._lat = {"fwd": 0.0, "bwd": 0.0, "step": 0.0}
        # MFU: the first forward's count, then per-token (or per-call) FLOPs
        from dslaunch.engine.observe.profiling.counting import ForwardCounter

        # a torch.compile'd module runs a graph a dispatch mode must not trace into: no count
        compiled = hasattr(engine.module, "_orig_mod")
        self._counter = None if compiled else ForwardCounter()
        self._counted_tokens = 0
        self.fwd_flops_per_token = None
        self.fwd_flops_per_call = None
        self.forwards = 0  # forward calls (for inputs that are not token ids)
        self._peak = None  # (FLOP/s, source), measured at the first print

    # -- forward, backward, step -------------------------------------------------------------------
    def forward_begin(self, tokens: int) -> None:
        e = self.engine
        self.forwards += 1
        if self._counter is not None and not self._counter.done:
            self._counted_tokens = tokens
            # hooked for this call only: code that strips and re-adds the module's hooks (TRL's
            # ZeRO-3 generation) or calls the module outside the engine never meets the counter
            self._counter.attach(e.module)
        if (self.profile_enabled and self.profiler is None and e.global_rank == 0
                and e.global_steps == self.cfg.profile_step and torch.is_grad_enabled()):
            from dslaunch.engine.observe.profiling.flops_profiler import FlopsProfiler

            self.profiler = FlopsProfiler(e.module, e, self.recompute)
            self.profiler.start_profile()
            self._lat = {"fwd": 0.0, "bwd": 0.0, "step": 0.0}
        if self.profiler is not None:
            self._begin()

    def forward_end(self) -> None:
        c = self._counter
        if c is not None and c.done:  # the first forward, counted
            self._counter = None
            if self._counted_tokens:
                self.fwd_flops_per_token = c.flops / self._counted_tokens
            self.fwd_flops_per_call = c.flops
        if self.profiler is not None:
            self._end("fwd")

    def phase_begin(self) -> None:
        if self.profiler is not None:
            self._begin()

    def phase_end(self, name: str) -> None:
        if self.profiler is not None:
            self._end(name)

    def _begin(self):
        self.profiler._sync()
        self._t0 = time.perf_counter()

    def _end(self, name):
        self.profiler._sync()
        self._lat[name] += time.perf_counter() - self._t0

    def step_done(self) -> None:
        """After a boundary step: the profiled step ends here (print, then remove the hooks)."""
        prof = self.profiler
        if prof is None:
            return
        self.profiler = None
        cfg = self.cfg
        prof.stop_profile()
        prof.step_latencies = dict(self._lat)
        self.profiled = {"fwd_flops": prof.get_total_flops(), "fwd_macs": prof.get_total_macs(),
                         "params": prof.get_total_params(), **self._lat}
        prof.print_model_profile(profile_step=self.engine.global_steps - 1,
                                 module_depth=cfg.module_depth, top_modules=cfg.top_modules,
                                 detailed=cfg.detailed, output_file=cfg.output_file)
        if cfg.output_file:
            print(f"[dslaunch] FLOPs profile of step {self.engine.global_steps - 1} written to "
                  f"{cfg.output_file}", flush=True)
        prof.end_profile()

    # -- the print line ---------------------------------------------------------------------------
    def step_flops(self, tokens: int, forwards: int) -> float | None:
        """Training FLOPs of ``tokens`` tokens (or ``forwards`` forward calls) on this rank."""
        factor = 3.0 + self.recompute
        if self.fwd_flops_per_token is not None and tokens:
            return factor * self.fwd_flops_per_token * tokens
        if self.fwd_flops_per_call is not None and forwards:
            return factor * self.fwd_flops_per_call * forwards
        return None

    def peak(self) -> tuple[float, str]:
        if self._peak is None:
            from dslaunch.engine.observe.profiling.peak import device_peak

            self._peak = device_peak(self.engine.device, self.engine.precision.dtype)
        return self._peak

    def mfu_text(self, tokens: int, forwards: int, seconds: float) -> str:
        """" TFLOPS/rank X MFU Y%" for the interval (empty when nothing is known); the first
        call also prints where the peak comes from."""
        flops = self.step_flops(tokens, forwards)
        if flops is None or seconds <= 0:
            return ""
        first = self._peak is None
        peak, source = self.peak()
        if first:
            print(f"[dslaunch] MFU peak per rank: {source}", flush=True)
        achieved = flops / seconds
        text = f" TFLOPS/rank {achieved / 1e12:.3g}"
        if peak > 0:
            text += f" MFU {100 * achieved / peak:.2f}%"
        return text
