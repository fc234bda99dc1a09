""""auto" values: who fills each one, and what happens to those nobody filled.

Hugging Face's DeepSpeed configs write "auto" where a framework fills the value before the engine
starts: the Trainer (``HfTrainerDeepSpeedConfig``) from its ``TrainingArguments`` and the model's
hidden size, Accelerate (``DeepSpeedPlugin`` and ``Accelerator.prepare``) from its plugin, its
DataLoader and ``DummyOptim``/``DummyScheduler``. ``FILLERS`` says who fills which key.

Two readings (``resolve_config(..., autos=)``):
- ``"describe"`` (``config validate|show`` and the launcher, which ship the config as written): an
  "auto" some framework fills is fine; it stays "auto" unless ``fills`` (``config show``'s
  ``--lr``, ``--hidden-size``... options) gives the value, and ``auto_lines`` says who fills it.
- ``"engine"`` (``dslaunch.initialize``): a framework had its chance. The three hidden-size keys
  are filled from the model (the formula Transformers and Accelerate use, or DeepSpeed's default
  when the model has no ``config.hidden_size``); every other "auto" is refused, naming the key,
  who would have filled it and what to put (DeepSpeed fails later with a TypeError, or, for
  fp16/bf16 and a few ZeRO keys, silently takes a default: we would rather say so).
In both, an "auto" no framework fills is refused. The batch triad's autos are left to ``batch.py``
(any two of the three infer the third, as in DeepSpeed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .batch import GAS, MBS, TBS, TRIAD
from .schema import SCHEDULER_PARAMS, TOP, Leaf, Section


@dataclass(frozen=True)
class Filler:
    trainer: Optional[str] = None  # the Trainer's source (a TrainingArguments field, a formula)
    accelerate: Optional[str] = None  # Accelerate's source
    option: Optional[str] = None  # the ``fills`` key (``config show --OPTION``) that gives it
    value: Optional[Callable[[Any], Any]] = None  # fills[option] -> the value (default: as is)
    put: Optional[str] = None  # what to write instead (else the schema's description)
    from_model: bool = False  # the engine fills it from the model's hidden size


def _hidden(factor: float) -> Callable[[int], int]:
    return lambda h: int(factor * h * h)


_PLUGIN = "DeepSpeedPlugin({}=...) (accelerate config's {}; default {})"
FILLERS = {
    MBS: Filler("per_device_train_batch_size", "the DataLoader's batch_size", "micro_batch_size"),
    GAS: Filler("gradient_accumulation_steps", "Accelerator(gradient_accumulation_steps=...)",
                "grad_accum"),
    TBS: Filler("world size x per_device_train_batch_size x gradient_accumulation_steps",
                "world size x the DataLoader's batch_size x gradient_accumulation_steps"),
    "gradient_clipping": Filler("max_grad_norm", "DeepSpeedPlugin(gradient_clipping=...), else 1.0",
                                "max_grad_norm"),
    "optimizer.params.lr": Filler("learning_rate", "DummyOptim(lr=...)", "lr",
                                  put="the learning rate, e.g. 1e-3"),
    "optimizer.params.betas": Filler("adam_beta1 and adam_beta2", None, "adam_betas",
                                     put="[beta1, beta2], e.g. [0.9, 0.999]"),
    "optimizer.params.eps": Filler("adam_epsilon", None, "adam_eps", put="a number, e.g. 1e-8"),
    "optimizer.params.weight_decay": Filler("weight_decay", "DummyOptim(weight_decay=...)",
                                            "weight_decay", put="a number, e.g. 0.0"),
    "scheduler.params.warmup_min_lr": Filler("always 0", "0 (DummyScheduler)", "warmup_min_lr",
                                             put="a number, e.g. 0"),
    "scheduler.params.warmup_max_lr": Filler("learning_rate", "the optimizer's lr (DummyScheduler)",
                                             "lr", put="the peak learning rate, e.g. 1e-3"),
    "scheduler.params.warmup_num_steps": Filler(
        "warmup_steps (or warmup_ratio x the training steps), at least 1",
        "DummyScheduler(warmup_num_steps=...)", "warmup_steps", put="a number of steps, e.g. 10"),
    "scheduler.params.total_num_steps": Filler(
        "the training steps it computes from the data, epochs and max_steps",
        "DummyScheduler(total_num_steps=...)", "total_steps",
        put="the number of optimizer steps of the run"),
    "fp16.enabled": Filler("fp16 or fp16_full_eval", 'Accelerator(mixed_precision="fp16")',
                           "precision", lambda p: p == "fp16"),
    "bf16.enabled": Filler("bf16 or bf16_full_eval", 'Accelerator(mixed_precision="bf16")',
                           "precision", lambda p: p == "bf16"),
    "zero_optimization.reduce_bucket_size": Filler(
        "hidden_size x hidden_size of the model's config", "the same", "hidden_size", _hidden(1),
        from_model=True),
    "zero_optimization.stage3_prefetch_bucket_size": Filler(
        "0.9 x hidden_size x hidden_size (at stage 3)", "0.9 x hidden_size x hidden_size",
        "hidden_size", _hidden(0.9), from_model=True),
    "zero_optimization.stage3_param_persistence_threshold": Filler(
        "10 x hidden_size (at stage 3)", "10 x hidden_size", "hidden_size", lambda h: 10 * h,
        from_model=True),
    # Accelerate fills these from its plugin (the Trainer builds that plugin from the same file)
    "zero_optimization.stage": Filler(
        None, _PLUGIN.format("zero_stage", "zero_stage", 2), "zero_stage"),
    "zero_optimization.offload_optimizer.device": Filler(
        None, _PLUGIN.format("offload_optimizer_device", "offload_optimizer_device", '"none"')),
    "zero_optimization.offload_param.device": Filler(
        None, _PLUGIN.format("offload_param_device", "offload_param_device", '"none"')),
    "zero_optimization.offload_optimizer.nvme_path": Filler(
        None, "DeepSpeedPlugin(offload_optimizer_nvme_path=...)"),
    "zero_optimization.offload_param.nvme_path": Filler(
        None, "DeepSpeedPlugin(offload_param_nvme_path=...)"),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": Filler(
        None, "DeepSpeedPlugin(zero3_save_16bit_model=...), else false"),
}


def who_fills(path: str, with_option: bool = True) -> str:
    """Who fills ``path`` when it is "auto" (and which ``config show`` option does), one line."""
    filler = FILLERS.get(path)
    if filler is None:
        return "nobody (neither the Hugging Face Trainer nor Accelerate fills this key)"
    parts = []
    if filler.trainer:
        parts.append(f"HF Trainer: {filler.trainer}")
    if filler.accelerate:
        parts.append(f"Accelerate: {filler.accelerate}")
    if filler.from_model:
        parts.append("else the engine: the model's config.hidden_size (DeepSpeed's default "
                     "when it has none)")
    if with_option and filler.option:
        parts.append(f"config show --{filler.option.replace('_', '-')}")
    elif with_option and path == TBS:
        parts.append("config show --world-size with the other two")
    return "; ".join(parts)


def resolve_autos(values: dict, sources: dict, autos: list, problems: list, lines: list,
                  mode: str, fills: dict, model_num_params: Optional[int]) -> None:
    """Fill or refuse each "auto" of ``autos`` (in place); ``lines``: one per "auto", who fills it.
    ``fills``: option name (``Filler.option``) -> value, from ``config show`` or the engine."""
    for path in autos:
        filler = FILLERS.get(path)
        if filler is not None and filler.option and fills.get(filler.option) is not None:
            given = fills[filler.option]
            _set(values, path, filler.value(given) if filler.value else given)
            flag = "--" + filler.option.replace("_", "-")
            lines.append(f"{path} = {json.dumps(_get(values, path))} (from {flag}); "
                         f"in a run: {who_fills(path, with_option=False)}")
            continue
        lines.append(f"{path}: {who_fills(path)}")
        if path in TRIAD:
            continue  # batch.py infers it from the other two, or says it cannot
        if filler is None:
            problems.append(f'{path}: "auto" cannot be resolved: {who_fills(path)}; put '
                            f"{_what_to_put(path, values, None)}")
        elif mode == "engine" and filler.from_model:
            spec = leaf_at(path, values)  # DeepSpeed's default; a bucket above the model is waste
            _set(values, path, min(spec.default, model_num_params) if model_num_params
                 else spec.default)
        elif mode == "engine":
            problems.append(f'{path}: "auto" cannot be resolved here; put '
                            f"{_what_to_put(path, values, filler)} (nothing filled it before "
                            f"dslaunch.initialize: {who_fills(path)})")


_PUT = {  # keys no framework fills: what to write there
    "optimizer.type": "an optimizer name, e.g. AdamW (or remove the optimizer section and pass "
                      "your own optimizer to dslaunch.initialize)",
    "scheduler.type": "a scheduler name: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or "
                      "LRRangeTest",
}


def _what_to_put(path: str, values: dict, filler: Optional[Filler]) -> str:
    if filler is not None and filler.put:
        return filler.put
    if path in _PUT:
        return _PUT[path]
    spec = leaf_at(path, values)
    return spec.describe() if spec is not None else "a value"


def leaf_at(path: str, values: dict) -> Optional[Leaf]:
    """The schema Leaf of a dotted path (scheduler params by the configured type), or None."""
    parts = path.split(".")
    if parts[:2] == ["scheduler", "params"] and len(parts) == 3:
        kind = (values.get("scheduler") or {}).get("type")
        section = SCHEDULER_PARAMS.get(kind)
        return section.fields.get(parts[2]) if section else None
    node = TOP
    for part in parts:
        if not isinstance(node, Section) or part not in node.fields:
            return None
        node = node.fields[part]
    return node if isinstance(node, Leaf) else None


def _get(values: dict, path: str):
    for part in path.split("."):
        values = values[part]
    return values


def _set(values: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = values
    for part in parents:
        node = node[part]
    node[last] = value
