"""resolve_config: load -> validate -> resolve "auto" -> batch triad (or the ``elasticity``
solver, ``elasticity.py``) -> cross-checks -> features.

Returns a ResolvedConfig (the full value tree, where each value came from, and the typed sections
of ``sections.py``) or raises one ConfigError listing every problem found. Every refusal of an
impossible combination lives here, once: the launcher (before any rank starts) and each rank
(with the parallel layout it really has) run the same checks.

Who resolves, and with which sizes:
- ``dslaunch run`` / ``config validate``: the world size; the data-parallel size follows from the
  written ``pipeline.stages`` and ``tensor_parallel.autotp_size``. The launcher then ships the
  config *as written* (``DSLAUNCH_CONFIG``), not its own resolution, so nothing it inferred for
  an assumed layout reaches the ranks as if the user had written it.
- each rank (``dslaunch.initialize``): its real data-parallel size, pipeline stages and
  tensor-parallel size, once; a written batch size that does not fit is refused, as DeepSpeed does.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .auto import resolve_autos
from .batch import GAS, MBS, TBS, TRIAD, resolve_batch
from .compression import CompressionConfigError
from .compression import parse as parse_compression
from .curriculum import schedule_problems
from .data_efficiency import data_efficiency_problems
from .elasticity import resolve_elastic
from .errors import ConfigError
from .features import unsupported_problems
from .loader import load_config_with_origin
from .sections import build
from .validate import check_config, show

_MISSING = object()


class ResolvedConfig:
    """The resolved config. ``values``: full tree; ``sources``: dotted path -> "file" | "default" |
    "inferred" | "auto"; ``notes``: what still depends on the world size (when none was given);
    ``auto_lines``: one line per "auto" of the file, saying who fills it;
    ``typed``: the same values as frozen, typed sections (``typed.zero_optimization.stage``),
    what the engine reads."""

    def __init__(self, values: dict, sources: dict, world_size: Optional[int],
                 dp_world_size: Optional[int], notes: list, origin: Optional[str] = None):
        self.values = values
        self.sources = sources
        self.world_size = world_size
        self.dp_world_size = dp_world_size
        self.notes = notes
        self.origin = origin
        self.auto_lines: list = []
        self.rewrites: list = []  # dotted top-level keys read as nested ones (dotted.py)
        self._typed = None

    @property
    def typed(self):
        """The frozen, typed sections (built once, on first use)."""
        if self._typed is None:
            self._typed = build(self.values)
        return self._typed

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
    """The data-parallel size of the batch triad once pipeline stages and sequence-parallel ranks
    take their share. AutoTP's ``tensor_parallel.autotp_size`` takes none: DeepSpeed checks an
    AutoTP job's triad against the whole world (tensor-parallel ranks, which train on the same
    samples, counted; the Hugging Face Trainer fills ``train_batch_size`` so)."""
    model_parallel = 1
    for size in ((values.get("pipeline") or {}).get("stages"),
                 values.get("sequence_parallel_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size > 1:
            model_parallel *= size
    return world_size // model_parallel if world_size % model_parallel == 0 else world_size


def _zero_group_checks(zero: dict, problems: list) -> None:
    """hpZ and MiCS (``engine/zero/stage3_groups.py``): stage 3 only, one of the two, not with
    parameters on NVMe, MiCS not with qwZ / qgZ. (Group sizes against the world are checked
    when the groups are made.)"""
    hpz, mics = zero.get("zero_hpz_partition_size") or 1, zero.get("mics_shard_size") or -1
    used = "zero_hpz_partition_size" if hpz > 1 else "mics_shard_size" if mics > 0 else None
    if used is None:
        if zero.get("mics_hierarchical_params_gather"):
            problems.append("zero_optimization.mics_hierarchical_params_gather: needs "
                            "mics_shard_size > 0")
        return
    if hpz > 1 and mics > 0:
        problems.append("zero_optimization.zero_hpz_partition_size: hpZ and mics_shard_size are "
                        "two ways to partition within groups; set one of them")
    if isinstance(zero["stage"], int) and zero["stage"] != 3:
        problems.append(f"zero_optimization.{used}: partitions parameters, so it needs "
                        f"zero_optimization.stage 3 (stage is {zero['stage']})")
    if zero["offload_param"]["device"] == "nvme":
        problems.append(f"zero_optimization.{used}: not supported with offload_param.device nvme "
                        "(use cpu or none)")
    if mics > 0 and (zero.get("zero_quantized_weights") or zero.get("zero_quantized_gradients")):
        problems.append("zero_optimization.mics_shard_size: not supported with ZeRO++'s quantized "
                        "weights or gradients (they communicate over all ranks); use "
                        "zero_hpz_partition_size with them")


def resolve_config(source_or_raw: Any, world_size: Optional[int] = None,
                   dp_world_size: Optional[int] = None, model_num_params: Optional[int] = None,
                   check_supported: bool = True, pipeline_stages: Optional[int] = None,
                   tensor_parallel_size: Optional[int] = None,
                   origin: Optional[str] = None, require_batch: bool = True,
                   autos: str = "engine", fills: Optional[dict] = None) -> ResolvedConfig:
    """``pipeline_stages`` / ``tensor_parallel_size``: the layout the rank really runs (the
    PipelineModule's stages, the mpu's model-parallel size), checked against the config;
    ``origin``: the file name to put in messages when the config comes as a dict or string;
    ``require_batch=False``: a config that writes no batch size at all is fine (``estimate-memory``
    reads the ZeRO and precision sections of partial configs);
    ``autos``: "engine" (an "auto" the engine cannot fill from the model is refused) or
    "describe" (an "auto" a framework fills stays "auto", see ``auto.py``); ``fills``: values
    for "auto" keys by ``auto.FILLERS`` option name (``lr``, ``hidden_size``, ...)."""
    if autos not in ("engine", "describe"):
        raise ValueError(f'autos={autos!r}: expected "engine" or "describe"')
    raw, loaded_from = load_config_with_origin(source_or_raw)
    origin = loaded_from or origin
    for name, size in (("world_size", world_size), ("dp_world_size", dp_world_size)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError([f"{name}: {size!r} is not a valid size; expected an integer >= 1"])
    dp = dp_world_size if dp_world_size is not None else world_size

    checked = check_config(raw)
    values, sources, problems = checked.values, checked.sources, checked.problems
    auto_lines: list = []
    resolve_autos(values, sources, checked.autos, problems, auto_lines, autos, fills or {},
                  model_num_params)
    if dp_world_size is None and world_size is not None:
        dp = _data_parallel_size(values, world_size)
    notes: list = list(checked.rewrites)
    no_batch = not require_batch and all(values[key] is None for key in TRIAD)
    if values["elasticity"]["enabled"] is True:  # the elastic solver sets the triad
        if not any(p.startswith("elasticity") for p in problems):
            resolve_elastic(values, sources, problems, notes, dp)
    elif not no_batch and not any(p.split(":", 1)[0] in TRIAD for p in problems):  # a bad value is reported once
        resolve_batch(values, sources, problems, notes, dp, world_size,
                      frameworks_fill=autos == "describe")
    for key in TRIAD:  # whatever the triad could not settle depends on the world size
        if values[key] == "auto" and autos == "engine":
            values[key] = None
    _cross_checks(values, sources, problems)
    _layout_checks(values, sources, problems, pipeline_stages, tensor_parallel_size)

    cfg = ResolvedConfig(values, sources, world_size, dp, notes, origin)
    cfg.auto_lines = auto_lines
    cfg.rewrites = checked.rewrites
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

    _precision_checks(values, problems)
    curriculum = values["curriculum_learning"]
    if curriculum["enabled"] is True:
        problems.extend(schedule_problems(curriculum))
    problems.extend(data_efficiency_problems(values["data_efficiency"]))
    if values.get("compression_training"):  # typed here (compression.py), applied by the engine
        try:
            parse_compression(values["compression_training"])
        except CompressionConfigError as exc:
            problems.append(str(exc))
    eigen = values["eigenvalue"]
    if eigen["enabled"] is True:
        if (isinstance(eigen["layer_num"], int) and eigen["layer_num"] < 1) or not eigen["layer_name"]:
            problems.append("eigenvalue.layer_num: name the model's list of blocks in "
                            "eigenvalue.layer_name and how many to measure in layer_num (>= 1)")
        if values["zero_optimization"]["stage"] == 3:  # its autograd graph sees gathered params
            problems.append("eigenvalue.enabled: needs zero_optimization.stage 0, 1 or 2 "
                            "(stage 3 releases the parameters the Hessian products need)")

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
    if zero["overlap_comm"] is None:
        # DeepSpeed: on for stage 3 only, since its overlap doubles a reduce_bucket_size buffer.
        # Ours costs at most IN_FLIGHT_BUCKETS capped buckets (zero/grad_reduce.py) and gives the same
        # numbers, so stage 2 overlaps too (stage 1 reduces at the boundary either way)
        zero["overlap_comm"] = zero["stage"] >= 2
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
    _zero_group_checks(zero, problems)
    for flag in ("zero_quantized_weights", "zero_quantized_gradients"):  # ZeRO++: stage 3 only
        if zero.get(flag) and isinstance(zero["stage"], int) and zero["stage"] != 3:
            problems.append(f"zero_optimization.{flag}: quantized communication (ZeRO++) needs "
                            f"zero_optimization.stage 3 (stage is {zero['stage']})")
        elif zero.get(flag) and values["fp16"]["enabled"] is True:  # the quantizers' inputs
            problems.append(f"zero_optimization.{flag}: quantized communication (ZeRO++) takes "
                            "fp32 or bf16 weights and gradients, not fp16; use bf16.enabled")

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


ONE_BIT = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb")


def _precision_checks(values: dict, problems: list) -> None:
    """torch_autocast and the bf16 master-weight switches: what cannot be combined."""
    autocast, bf16 = values["torch_autocast"], values["bf16"]
    if autocast["enabled"] is True:
        if values["fp16"]["enabled"] is True:  # with bf16 it is fine: DeepSpeed's examples do it
            problems.append("torch_autocast.enabled: cannot be combined with fp16.enabled yet "
                            "(fp16 needs its loss scaler around autocast); enable one of them")
        if autocast["dtype"] in ("fp16", "float16", "half", "torch.float16"):
            problems.append(f"torch_autocast.dtype: {show(autocast['dtype'])} is not supported "
                            "yet (fp16 autocast needs a gradient scaler); use \"bf16\"")
        modules = autocast["lower_precision_safe_modules"]
        if modules is not None and (not isinstance(modules, list) or not all(
                isinstance(m, str) and "." in m.strip(".") for m in modules)):
            problems.append(f"torch_autocast.lower_precision_safe_modules: {show(modules)} is not "
                            "a list of class names with their module (e.g. "
                            "[\"torch.nn.Linear\", \"mypkg.layers.MyLinear\"])")
    master, states = bf16["bf16_master_weights_and_grads"], bf16["bf16_optimizer_states"]
    if (master or states) and bf16["enabled"] is not True:
        key = "bf16_master_weights_and_grads" if master else "bf16_optimizer_states"
        problems.append(f"bf16.{key}: needs bf16.enabled true (it keeps the bf16 training "
                        "weights' masters in bf16)")
    elif states and not master:
        problems.append("bf16.bf16_optimizer_states: needs bf16.bf16_master_weights_and_grads "
                        "true (optimizer states follow the master weights' dtype)")
    elif master and not states and (
            values["zero_optimization"]["offload_optimizer"]["device"] != "cpu"
            or values["zero_optimization"]["stage"] == 0):
        problems.append("bf16.bf16_master_weights_and_grads: keeping fp32 optimizer states for "
                        "bf16 master weights needs zero_optimization.offload_optimizer.device "
                        "\"cpu\" at stage 1-3 (the CPU Adam keeps them, as in DeepSpeed); or set "
                        "bf16.bf16_optimizer_states true to keep them in bf16")
    if master and (values.get("optimizer") or {}).get("type") in ONE_BIT:
        problems.append("bf16.bf16_master_weights_and_grads: cannot be used with the 1-bit "
                        "optimizers (they keep fp32 masters)")


def zero_stage(source_or_raw: Any) -> int:
    """The ZeRO stage a config asks for, validated. ``zero.Init`` reads it from configs that need
    not be complete (DeepSpeed's ``Init(config_dict_or_path={"zero_optimization": ...})``)."""
    raw, origin = load_config_with_origin(source_or_raw)
    checked = check_config(raw)
    bad = [p for p in checked.problems if p.startswith("zero_optimization.stage")]
    if bad:
        raise ConfigError(bad, source=origin)
    stage = checked.values["zero_optimization"]["stage"]
    return stage if isinstance(stage, int) else 0  # "auto": DeepSpeed's default, 0


def _layout_checks(values: dict, sources: dict, problems: list, pipeline_stages: Optional[int],
                   tensor_parallel_size: Optional[int]) -> None:
    """Combinations of ZeRO, 1-bit optimizers and the parallel layout that cannot run. The layout
    is the rank's real one when given, else what the config writes."""
    zero = values["zero_optimization"]
    stage = zero["stage"] if isinstance(zero["stage"], int) else 0
    written_stages = values["pipeline"]["stages"]
    if pipeline_stages is not None and sources.get("pipeline.stages") == "file" \
            and isinstance(written_stages, int) and written_stages > 1 \
            and written_stages != pipeline_stages:
        problems.append(f"pipeline.stages: {written_stages} but the PipelineModule has "
                        f"{pipeline_stages} stages; make them agree (or remove the key)")
    stages = pipeline_stages if pipeline_stages is not None else written_stages
    tp = tensor_parallel_size if tensor_parallel_size is not None else \
        values["tensor_parallel"]["autotp_size"]
    if stage >= 2 and isinstance(stages, int) and stages > 1:
        problems.append(f"zero_optimization.stage: {stage} cannot be combined with pipeline "
                        "parallelism (gradients are partitioned while micro-batches are still in "
                        "flight; DeepSpeed refuses it too): use stage 0 or 1")
    autotp = values["tensor_parallel"]["autotp_size"]
    if stage >= 3 and isinstance(tp, int) and tp > 1 and not (isinstance(autotp, int) and autotp > 1):
        # (AutoTP + ZeRO 3 runs, as in DeepSpeed 0.19: tests/test_autotp.py)
        problems.append("zero_optimization.stage: 3 with the tensor parallelism of an mpu is not "
                        "supported yet (AutoTP's is: write tensor_parallel.autotp_size): use "
                        "stage 0, 1 or 2")
    name = (values.get("optimizer") or {}).get("type")
    problems.extend(onebit_problems(name, stage, zero["offload_optimizer"]["device"]))
    if values["gradient_allreduce_op"] == "sum":  # (DeepSpeed also refuses it at stage 3; we sum)
        if name in ONE_BIT:
            problems.append(f"gradient_allreduce_op: \"sum\" cannot be used with {name} (the "
                            "1-bit optimizers average their compressed momentum)")
    if values["torch_autocast"]["enabled"] is True and isinstance(stages, int) and stages > 1:
        problems.append("torch_autocast.enabled: not supported with pipeline parallelism yet "
                        "(the pipeline runs its stages outside the engine's forward)")
    if values["managed_gradient_accumulation"] is False:
        if isinstance(stages, int) and stages > 1:  # DeepSpeed refuses it too
            problems.append("managed_gradient_accumulation: false is not supported with "
                            "pipeline parallelism (train_batch() owns the micro-batches)")
        if name in ONE_BIT:
            problems.append(f"managed_gradient_accumulation: false cannot be used with {name}")


def onebit_problems(optimizer_name, stage: int, offload_optimizer_device: str) -> list:
    """Why a 1-bit optimizer cannot run with these ZeRO settings (empty: it can). Also asked by
    the engine when the 1-bit optimizer is the user's own object, not the config's."""
    if optimizer_name not in ONE_BIT:
        return []
    if stage >= 1:
        return [f"zero_optimization.stage: {optimizer_name} works with ZeRO stage 0 only (the "
                f"1-bit optimizers need the whole optimizer state on every rank, as in "
                f"DeepSpeed); got stage {stage}"]
    if offload_optimizer_device == "cpu":  # nvme at stage 0 is refused by _cross_checks
        return [f"zero_optimization.offload_optimizer.device: \"cpu\" cannot be used with "
                f"{optimizer_name} (stage 0 only, nothing to offload)"]
    return []


def _numbers(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
