"""resolve_config: load -> validate -> resolve "auto" -> batch triad -> cross-checks -> features.

Returns a ResolvedConfig (the full value tree and where each value came from) or raises one
ConfigError listing every problem found.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .auto import resolve_autos
from .batch import GAS, MBS, TBS, TRIAD, resolve_batch
from .errors import ConfigError
from .features import unsupported_problems
from .loader import load_config_with_origin
from .validate import check_config, show

_MISSING = object()


class ResolvedConfig:
    """The resolved config. ``values``: full tree; ``sources``: dotted path -> "file" | "default" |
    "inferred" | "auto"; ``notes``: what still depends on the world size (when none was given)."""

    def __init__(self, values: dict, sources: dict, world_size: Optional[int],
                 dp_world_size: Optional[int], notes: list, origin: Optional[str] = None):
        self.values = values
        self.sources = sources
        self.world_size = world_size
        self.dp_world_size = dp_world_size
        self.notes = notes
        self.origin = origin

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def train_batch_size(self) -> Optional[int]:
        return self.values[TBS]

    @property
    def train_micro_batch_size_per_gpu(self) -> Optional[int]:
        return self.values[MBS]

    @property
    def gradient_accumulation_steps(self) -> Optional[int]:
        return self.values[GAS]

    def to_json(self) -> str:
        return json.dumps(self.values, separators=(",", ":"))

    def __repr__(self) -> str:
        return (f"ResolvedConfig(train_batch_size={self.train_batch_size}, micro="
                f"{self.train_micro_batch_size_per_gpu}, grad_accum={self.gradient_accumulation_steps}, "
                f"world_size={self.world_size})")


def _data_parallel_size(values: dict, world_size: int) -> int:
    """The data-parallel size once pipeline stages and tensor-parallel ranks take their share."""
    model_parallel = 1
    for size in ((values.get("pipeline") or {}).get("stages"),
                 (values.get("tensor_parallel") or {}).get("autotp_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size > 1:
            model_parallel *= size
    return world_size // model_parallel if world_size % model_parallel == 0 else world_size


def resolve_config(source_or_raw: Any, world_size: Optional[int] = None,
                   dp_world_size: Optional[int] = None, model_num_params: Optional[int] = None,
                   check_supported: bool = True) -> ResolvedConfig:
    raw, origin = load_config_with_origin(source_or_raw)
    for name, size in (("world_size", world_size), ("dp_world_size", dp_world_size)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError([f"{name}: {size!r} is not a valid size; expected an integer >= 1"])
    dp = dp_world_size if dp_world_size is not None else world_size

    checked = check_config(raw)
    values, sources, problems = checked.values, checked.sources, checked.problems
    resolve_autos(values, sources, checked.autos, problems, model_num_params)
    if dp_world_size is None and world_size is not None:
        dp = _data_parallel_size(values, world_size)
    notes: list = []
    if not any(p.split(":", 1)[0] in TRIAD for p in problems):  # a bad triad value is reported once
        resolve_batch(values, sources, problems, notes, dp, world_size)
    for key in TRIAD:  # whatever the triad could not settle depends on the world size
        if values[key] == "auto":
            values[key] = None
    _cross_checks(values, sources, problems)

    cfg = ResolvedConfig(values, sources, world_size, dp, notes, origin)
    if check_supported:
        problems.extend(unsupported_problems(cfg.get))
    if problems:
        raise ConfigError(problems, source=origin)
    return cfg


def _cross_checks(values: dict, sources: dict, problems: list) -> None:
    """Impossible combinations and DeepSpeed's deprecated spellings."""
    if values["fp16"]["enabled"] is True and values["bf16"]["enabled"] is True:
        problems.append("fp16.enabled: fp16 and bf16 are both enabled; enable one of them")
    if values["amp"]["enabled"] is True and (values["fp16"]["enabled"] is True
                                             or values["bf16"]["enabled"] is True):
        problems.append("amp.enabled: amp cannot be combined with fp16 or bf16; enable one of them")

    zero = values["zero_optimization"]
    # Deprecated ZeRO flags are turned into the offload sections they stand for.
    for flag, section in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if zero.get(flag):
            if sources.get(f"zero_optimization.{section}.device") == "default":
                zero[section]["device"] = "cpu"
                sources[f"zero_optimization.{section}.device"] = "file"
            elif zero[section]["device"] != "cpu":
                problems.append(f"zero_optimization.{flag}: conflicts with zero_optimization."
                                f"{section}.device={show(zero[section]['device'])}; keep one")
    if zero.get("cpu_offload_use_pin_memory"):
        for section in ("offload_optimizer", "offload_param"):
            if sources.get(f"zero_optimization.{section}.pin_memory") == "default":
                zero[section]["pin_memory"] = True
    if zero["overlap_comm"] is None:  # DeepSpeed's dynamic default
        zero["overlap_comm"] = zero["stage"] == 3
        sources["zero_optimization.overlap_comm"] = "default"

    for section in ("offload_optimizer", "offload_param"):
        sub = zero[section]
        if sub["device"] == "nvme" and not sub["nvme_path"]:
            problems.append(f"zero_optimization.{section}.nvme_path: missing; device is nvme, so put "
                            f"the directory on the NVMe drive here")
    if zero["offload_optimizer"]["device"] == "nvme" and zero["stage"] == 0:
        problems.append("zero_optimization.offload_optimizer.device: nvme needs zero_optimization."
                        "stage 1, 2 or 3 (stage is 0: nothing is partitioned to offload)")
    if zero["offload_param"]["device"] != "none" and isinstance(zero["stage"], int) and zero["stage"] != 3:
        problems.append(f"zero_optimization.offload_param.device: parameter offload needs "
                        f"zero_optimization.stage 3 (stage is {zero['stage']})")

    top, nested = values["gradient_accumulation_dtype"], values["data_types"]["grad_accum_dtype"]
    if top is not None and nested is not None and top != nested:
        problems.append(f"gradient_accumulation_dtype: {show(top)} conflicts with "
                        f"data_types.grad_accum_dtype={show(nested)}; keep one")
    elif top is not None:
        values["data_types"]["grad_accum_dtype"] = top
        sources["data_types.grad_accum_dtype"] = "file"

    sched = values.get("scheduler")
    if sched and isinstance(sched.get("params"), dict):
        params = sched["params"]
        if sched["type"] == "OneCycle" and _numbers(params.get("cycle_min_lr"), params.get("cycle_max_lr")):
            if params["cycle_min_lr"] > params["cycle_max_lr"]:
                problems.append(f"scheduler.params.cycle_min_lr: {params['cycle_min_lr']} is above "
                                f"cycle_max_lr={params['cycle_max_lr']}")
        if _numbers(params.get("warmup_num_steps"), params.get("total_num_steps")):
            if params["warmup_num_steps"] > params["total_num_steps"]:
                problems.append(f"scheduler.params.warmup_num_steps: {params['warmup_num_steps']} is "
                                f"more than total_num_steps={params['total_num_steps']}")


def _numbers(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
