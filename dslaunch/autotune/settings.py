"""The config given to ``dslaunch autotune``: what is tuned and how.

The tuned dimensions are written in the config itself, DeepSpeed's way: a list (or ``"all"``)
where a single value would be.
- ``zero_optimization.stage``: an int, a list of ints, or ``"all"`` (absent: all of 0-3);
- ``train_micro_batch_size_per_gpu``: a list (those sizes); an int, absent or ``"auto"``: powers
  of two between the ``autotuning`` section's bounds, ``num_tuning_micro_batch_sizes`` of them
  (as DeepSpeed's tuner, which only takes a list as the sizes to try);
- ``zero_optimization.offload_optimizer.device`` / ``offload_param.device``: a device or a list
  of devices (dslaunch's extension; absent: no offload).
Every other key is copied into each trial's config unchanged. The config with each list replaced
by one of its values goes through the same validation as ``dslaunch run``'s, so a bad key (an
unknown ``autotuning.metric``, a ``tuner_type`` typo) is refused before any trial, by name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from dslaunch.config import ConfigError, load_config, resolve_config

TUNED_KEYS = ("zero_optimization.stage", "train_micro_batch_size_per_gpu",
              "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device")


@dataclass
class TuningInput:
    base: dict  # the user's config without the tuned keys and without the batch size
    stages: list
    micro_batches: list | None  # None: generated from the bounds
    offload_optimizer: list
    offload_param: list
    gas: int
    section: object  # the typed ``autotuning`` section
    precision: str
    optimizer: str


def _as_list(value, what: str, allowed) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise ConfigError([f"{what}: an empty list tunes nothing"])
    for v in values:
        if v not in allowed:
            raise ConfigError([f"{what}: {v!r} is not allowed; expected one of "
                               + ", ".join(map(repr, allowed))])
    return values


def _pop(tree: dict, path: str):
    node = tree
    *parents, last = path.split(".")
    for name in parents:
        node = node.get(name)
        if not isinstance(node, dict):
            return None
    return node.pop(last, None)


def _put(tree: dict, path: str, value) -> None:
    node = tree
    *parents, last = path.split(".")
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value


def read_tuning_input(path: str, world_size: int) -> TuningInput:
    """Raises ConfigError naming the key for anything the tuner cannot use."""
    raw = load_config(path)
    base = copy.deepcopy(raw)
    stage = _pop(base, "zero_optimization.stage")
    mbs = _pop(base, "train_micro_batch_size_per_gpu")
    oo = _pop(base, "zero_optimization.offload_optimizer.device")
    op = _pop(base, "zero_optimization.offload_param.device")
    base.pop("train_batch_size", None)  # the tuner sets micro-batch x accumulation x ranks
    stages = [0, 1, 2, 3] if stage in (None, "all") else _as_list(
        stage, "zero_optimization.stage", (0, 1, 2, 3))
    micro = None
    if isinstance(mbs, (list, tuple)):
        micro = list(mbs)
        if not micro or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in micro):
            raise ConfigError([f"train_micro_batch_size_per_gpu: {mbs!r}: expected a list of "
                               "integers >= 1 to tune"])
    devices = ("none", "cpu", "nvme")
    offload_opt = ["none"] if oo is None else _as_list(
        oo, "zero_optimization.offload_optimizer.device", devices)
    offload_par = ["none"] if op is None else _as_list(
        op, "zero_optimization.offload_param.device", devices)
    gas = base.get("gradient_accumulation_steps", 1)
    if gas == "auto" or gas is None:
        gas = 1
    base["gradient_accumulation_steps"] = gas

    # validate the rest as a run would, with one value in place of each list
    probe = copy.deepcopy(base)
    _put(probe, "zero_optimization.stage", max(stages))
    _put(probe, "train_micro_batch_size_per_gpu", micro[0] if micro else
         (mbs if isinstance(mbs, int) and not isinstance(mbs, bool) else 1))
    try:
        resolved = resolve_config(probe, world_size=world_size, origin=path)
    except ConfigError as exc:
        exc.source = exc.source or path
        raise
    section = resolved.typed.autotuning
    problems = []
    if section.end_profile_step <= section.start_profile_step:
        problems.append(f"autotuning.end_profile_step: {section.end_profile_step} must be greater "
                        f"than autotuning.start_profile_step ({section.start_profile_step})")
    if section.min_train_micro_batch_size_per_gpu > section.max_train_micro_batch_size_per_gpu:
        problems.append("autotuning.min_train_micro_batch_size_per_gpu: more than "
                        "autotuning.max_train_micro_batch_size_per_gpu")
    mappings = section.arg_mappings
    if mappings is not None and (not hasattr(mappings, "items") or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mappings.items())):
        problems.append("autotuning.arg_mappings: expected {\"config key\": \"--script-flag\"}")
    if problems:
        raise ConfigError(problems, source=path)
    typed = resolved.typed
    precision = "bf16" if typed.bf16.enabled is True else "fp16" if typed.fp16.enabled is True \
        else "fp32"
    optimizer = (typed.optimizer.type if typed.optimizer is not None else "adam").lower()
    return TuningInput(base=base, stages=stages, micro_batches=micro,
                       offload_optimizer=offload_opt, offload_param=offload_par, gas=int(gas),
                       section=section, precision=precision, optimizer=optimizer)
