"""DeepSpeed's FLOPs profiler API (``deepspeed.profiling.flops_profiler``), over the ATen-level
counting of ``counting.py``.

Per module it keeps, like DeepSpeed (the same attribute names, for code that reads them):
``__flops__`` / ``__macs__`` (the operators run while the module was the innermost one running),
``__params__`` and ``__duration__`` (forward seconds, the device synchronised around it). A
module's totals (``get_module_flops``) add its submodules'. Only forward passes are counted: the
engine's profiled step adds backward as 2x forward (plus ``recompute_fwd_factor``), as DeepSpeed.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from dslaunch.engine.observe.profiling.counting import CountingMode

DEFAULT_PRECISION = 2

_ATTRS = ("__flops__", "__macs__", "__params__", "__duration__", "__start_time__")


def _synchronizer():
    """The accelerator's synchronize (resolved once per profile: it imports the backend)."""
    from dslaunch.accelerator import get_accelerator

    return get_accelerator().synchronize


def _param_count(p) -> int:
    # a released ZeRO-3 parameter keeps its full size in ds_numel
    return int(getattr(p, "ds_numel", p.numel()))


class FlopsProfiler:
    """Measures each module's forward FLOPs, MACs, parameters and latency (DeepSpeed's class).

    ``ds_engine`` (optional): the engine whose step is profiled (the summary then shows its
    world size, batch and forward/backward/step latencies). ``recompute_fwd_factor``: the share of
    the forward recomputed in backward (activation checkpointing), for the FLOPs of a step."""

    def __init__(self, model, ds_engine=None, recompute_fwd_factor=0.0):
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False
        self._handles: list = []
        self._stack: list = []  # modules whose forward is running, innermost last
        self._mode = None
        self._sync = None
        self.step_latencies = None  # {"fwd", "bwd", "step"} seconds, filled by the engine

    # -- lifecycle -----------------------------------------------------------------------------
    def start_profile(self, ignore_list=None):
        """Reset the counts and start counting every forward of the model (``ignore_list``:
        module types whose own operators are not counted, DeepSpeed's argument)."""
        self.reset_profile()
        self._sync = _synchronizer()
        ignored = tuple(ignore_list or ())
        for module in self.model.modules():
            if ignored and isinstance(module, ignored):
                continue
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        self.started = True

    def stop_profile(self):
        """Stop counting (the counts stay readable until ``end_profile``)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._stack.clear()
        self._exit_mode()

    def reset_profile(self):
        for module in self.model.modules():
            module.__flops__ = 0
            module.__macs__ = 0
            module.__params__ = sum(_param_count(p) for p in module.parameters())
            module.__start_time__ = 0.0
            module.__duration__ = 0.0

    def end_profile(self):
        """Stop and remove every attribute the profile added."""
        if not self.started:
            return
        self.stop_profile()
        self.started = False
        for module in self.model.modules():
            for name in _ATTRS:
                if name in module.__dict__:
                    delattr(module, name)

    # -- hooks -----------------------------------------------------------------------------------
    def _enter(self, module, inputs):
        if self._mode is None:  # the outermost profiled forward: start seeing operators
            self._mode = CountingMode(self._add)
            self._mode.__enter__()
        self._stack.append(module)
        self._sync()
        module.__start_time__ = time.perf_counter()

    def _leave(self, module, inputs, output):
        self._sync()
        module.__duration__ += time.perf_counter() - module.__start_time__
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        if not self._stack:
            self._exit_mode()

    def _exit_mode(self):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def _add(self, flops, macs):
        if self._stack:
            owner = self._stack[-1]
            owner.__flops__ += flops
            owner.__macs__ += macs

    # -- totals ----------------------------------------------------------------------------------
    def get_total_flops(self, as_string=False):
        """Forward floating-point operations of the profiled passes."""
        total = get_module_flops(self.model)
        return number_to_string(total) if as_string else total

    def get_total_macs(self, as_string=False):
        """Forward multiply-accumulates of the profiled passes."""
        total = get_module_macs(self.model)
        return macs_to_string(total) if as_string else total

    def get_total_duration(self, as_string=False):
        """Seconds in the model's forward during the profile."""
        total = get_module_duration(self.model)
        return duration_to_string(total) if as_string else total

    def get_total_params(self, as_string=False):
        """Parameters of the model (a ZeRO-3 parameter counts whole)."""
        total = getattr(self.model, "__params__", None)
        if total is None:
            total = sum(_param_count(p) for p in self.model.parameters())
        return params_to_string(total) if as_string else total

    # -- report ----------------------------------------------------------------------------------
    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True,
                            output_file=None):
        """Print the summary, the top modules per depth and (``detailed``) the module tree with
        each module's params, MACs, latency and FLOPS; to ``output_file`` when given (written
        fresh, as DeepSpeed), else stdout."""
        if not self.started:
            return
        text = self.profile_text(profile_step, module_depth, top_modules, detailed)
        if output_file:
            os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
            with open(output_file, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def profile_text(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True) -> str:
        flops, macs = self.get_total_flops(), self.get_total_macs()
        params, fwd = self.get_total_params(), self.get_total_duration()
        lines = ["", "-------------------------- dslaunch FLOPs profiler --------------------------",
                 f"Profile summary at step {profile_step}:"]

        def row(label, value):
            lines.append(f"{label:<64}  {value}")

        engine = self.ds_engine
        if engine is not None:
            row("world size:", engine.world_size)
            row("data parallel size:", engine.dp_world_size)
            row("batch size per rank:", engine.train_micro_batch_size_per_gpu())
        row("params per rank:", params_to_string(params))
        row("fwd MACs per rank:", macs_to_string(macs))
        row("fwd flops per rank:", number_to_string(flops))
        lat = self.step_latencies
        if lat is not None:
            fwd = lat["fwd"]
        row("fwd latency:", duration_to_string(fwd))
        row("fwd FLOPS per rank = fwd flops / fwd latency:", flops_to_string(flops / fwd if fwd else 0))
        if lat is not None:
            bwd_factor = 2 + self.recompute_fwd_factor
            bwd, step = lat["bwd"], lat["step"]
            it = fwd + bwd + step
            row("bwd latency:", duration_to_string(bwd))
            row(f"bwd FLOPS per rank = {bwd_factor:g} x fwd flops / bwd latency:",
                flops_to_string(bwd_factor * flops / bwd if bwd else 0))
            row(f"fwd+bwd FLOPS per rank = {bwd_factor + 1:g} x fwd flops / (fwd+bwd latency):",
                flops_to_string((bwd_factor + 1) * flops / (fwd + bwd) if fwd + bwd else 0))
            row("step latency:", duration_to_string(step))
            row("iter latency:", duration_to_string(it))
            row(f"FLOPS per rank = {bwd_factor + 1:g} x fwd flops / iter latency:",
                flops_to_string((bwd_factor + 1) * flops / it if it else 0))
            if engine is not None:
                samples = engine.train_micro_batch_size_per_gpu() * engine.world_size
                row("samples/second:", round(samples / it, DEFAULT_PRECISION) if it else 0)
        lines.append("")
        lines.append("----------------------------- Aggregated profile per rank -----------------------------")
        lines.extend(self._aggregated_lines(module_depth, top_modules))
        if detailed:
            lines.append("")
            lines.append("------------------------------ Detailed profile per rank ------------------------------")
            lines.append("Each module: params, % of params, MACs, % of MACs, fwd latency, % of fwd "
                         "latency, fwd FLOPS. Operators a module runs itself (functionals) count in "
                         "that module, so a parent's figures can exceed the sum of its children's.")
            lines.extend(self._tree_lines(self.model, "", 0, module_depth,
                                          params, macs, get_module_duration(self.model)))
        lines.append("------------------------------------------------------------------------------")
        return "\n".join(lines)

    def _tree_lines(self, module, name, depth, max_depth, total_params, total_macs, total_dur):
        params = getattr(module, "__params__", 0)
        macs, flops = get_module_macs(module), get_module_flops(module)
        dur = get_module_duration(module)

        def pct(a, b):
            return round(100 * a / b, DEFAULT_PRECISION) if b else 0

        own = module.extra_repr()
        figures = (f"{params_to_string(params)} = {pct(params, total_params):g}% Params, "
                   f"{macs_to_string(macs)} = {pct(macs, total_macs):g}% MACs, "
                   f"{duration_to_string(dur)} = {pct(dur, total_dur):g}% latency, "
                   f"{flops_to_string(flops / dur if dur else 0)}" + (f", {own}" if own else ""))
        indent = "  " * depth
        label = f"({name}): " if name else ""
        lines = [f"{indent}{label}{type(module).__name__}({figures})"]
        if max_depth < 0 or depth < max_depth:
            for child_name, child in module.named_children():
                lines.extend(self._tree_lines(child, child_name, depth + 1, max_depth,
                                              total_params, total_macs, total_dur))
        return lines

    def _aggregated_lines(self, module_depth=-1, top_modules=1) -> list:
        """The top modules by params, MACs and latency at each depth (types aggregated)."""
        per_depth: dict = {}

        def walk(module, depth):
            info = per_depth.setdefault(depth, {})
            rec = info.setdefault(type(module).__name__, [0, 0, 0.0])
            rec[0] += getattr(module, "__params__", 0)
            rec[1] += get_module_macs(module)
            rec[2] += get_module_duration(module)
            for child in module.children():
                walk(child, depth + 1)

        walk(self.model, 0)
        depth = max(per_depth) if module_depth < 0 else min(module_depth, max(per_depth))
        info = per_depth[depth]
        k = min(top_modules, len(info))

        def top(i, fmt):
            best = sorted(info.items(), key=lambda kv: kv[1][i], reverse=True)[:k]
            return ", ".join(f"{n}: {fmt(v[i])}" for n, v in best)

        return [f"Top {k} modules in terms of params, MACs or fwd latency at depth {depth}:",
                f"params    - {top(0, params_to_string)}",
                f"MACs      - {top(1, macs_to_string)}",
                f"latency   - {top(2, duration_to_string)}"]

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1):
        if self.started:
            print("\n".join(self._aggregated_lines(module_depth, top_modules)), flush=True)


# -- module totals -------------------------------------------------------------------------------

def get_module_flops(module) -> int:
    return sum(getattr(m, "__flops__", 0) for m in module.modules())


def get_module_macs(module) -> int:
    return sum(getattr(m, "__macs__", 0) for m in module.modules())


def get_module_duration(module) -> float:
    duration = getattr(module, "__duration__", 0.0)
    if duration == 0:  # a container never called itself (ModuleList): its children's time
        duration = sum(get_module_duration(m) for m in module.children())
    return duration


# -- numbers as text (DeepSpeed's forms: "1.23 G", "4.5 MMACs", "3.2 ms") -----------------------

_UNITS = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3), ("", 1.0), ("m", 1e-3), ("u", 1e-6))


def number_to_string(num, units=None, precision=DEFAULT_PRECISION) -> str:
    if units is None:
        units, magnitude = next(((u, m) for u, m in _UNITS if num >= m or (m == 1.0 and num == 0)),
                                ("u", 1e-6))
    else:
        magnitude = dict(_UNITS).get(units, 1.0)
    return f"{round(num / magnitude, precision):g} {units}"


def macs_to_string(macs, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(macs, units, precision)}MACs"


def flops_to_string(flops, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(flops, units, precision)}FLOPS"


def bytes_to_string(b, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(b, units, precision)}B"


def params_to_string(params_num, units=None, precision=DEFAULT_PRECISION) -> str:
    units = units.replace("B", "G") if units else units
    return number_to_string(params_num, units, precision).replace("G", "B").strip()


def duration_to_string(duration, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(duration, units, precision)}s"


# -- one call ------------------------------------------------------------------------------------

def get_model_profile(model, input_shape=None, args=[], kwargs={}, print_profile=True,  # noqa: B006
                      detailed=True, module_depth=-1, top_modules=1, warm_up=1, as_string=True,
                      output_file=None, ignore_modules=None, mode="forward"):
    """(flops, macs, params) of one forward (``mode="generate"``: one ``model.generate``) of
    ``model`` on ``args``/``kwargs``, or on one tensor of ``input_shape`` (the model's dtype and
    device, uninitialised values, as DeepSpeed); ``warm_up`` unprofiled calls first. The model is
    put in eval mode. ``as_string``: the three as text ("1.2 G", "600 MMACs", "3 M")."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("get_model_profile: model must be a torch.nn.Module")
    if mode not in ("forward", "generate"):
        raise ValueError(f"get_model_profile: mode must be 'forward' or 'generate', not {mode!r}")
    model.eval()
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError("get_model_profile: input_shape must be a non-empty tuple")
        first = next(model.parameters(), None)
        args = [torch.empty(input_shape, dtype=first.dtype if first is not None else None,
                            device=first.device if first is not None else None)]
    if not args and not kwargs:
        raise ValueError("get_model_profile: give input_shape, args or kwargs")
    call = model.generate if mode == "generate" else model
    with torch.no_grad():
        for _ in range(warm_up):
            call(*args, **kwargs)
        prof = FlopsProfiler(model)
        prof.start_profile(ignore_list=ignore_modules)
        try:
            call(*args, **kwargs)
            flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
            if print_profile:
                prof.print_model_profile(profile_step=warm_up, module_depth=module_depth,
                                         top_modules=top_modules, detailed=detailed,
                                         output_file=output_file)
        finally:
            prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
