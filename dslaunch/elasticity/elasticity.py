"""DeepSpeed's elasticity calls over dslaunch's solver (``dslaunch.config.elasticity.Elastic``):
the same section keys, defaults and checks as a config given to ``dslaunch.initialize``."""

from __future__ import annotations

import json
import os

from dslaunch.elasticity.config import ElasticityConfigError, ElasticityIncompatibleWorldSize

KEY = "elasticity"
ENV = "DEEPSPEED_ELASTICITY_CONFIG"  # the section as the scheduler saw it (DeepSpeed's variable)


def elasticity_enabled(ds_config: dict) -> bool:
    return bool(ds_config.get(KEY, {}).get("enabled", False))


def _section(given: dict) -> dict:
    """The section with the schema's defaults filled in, or ElasticityConfigError."""
    from dslaunch.config import ConfigError, resolve_config
    from dslaunch.config.elasticity import _section_problems

    if not isinstance(given, dict):
        raise ElasticityConfigError(f"{KEY}: expected a dict, got {type(given).__name__}")
    try:  # resolved disabled: the defaults and types, without solving for a batch
        values = resolve_config({KEY: {**given, "enabled": False}}, require_batch=False,
                                check_supported=False).values[KEY]
    except ConfigError as exc:
        raise ElasticityConfigError(str(exc)) from None
    values["enabled"] = True
    problems = _section_problems(values)
    if problems:
        raise ElasticityConfigError("; ".join(problems))
    return values


def compute_elastic_config(ds_config: dict, target_deepspeed_version: str = "", world_size: int = 0,
                           return_microbatch: bool = False):
    """DeepSpeed's call: ``(train_batch_size, valid_gpus)``, or ``(train_batch_size, valid_gpus,
    micro_batch_size)`` when ``world_size`` is given (or ``return_microbatch``). ``valid_gpus``
    are the data-parallel sizes that keep the batch; a ``world_size`` outside them raises
    ElasticityIncompatibleWorldSize (version 0.1; 0.2 gives it a batch of its own, as DeepSpeed).
    ``target_deepspeed_version`` is accepted and not compared."""
    from dslaunch.config.elasticity import Elastic

    del target_deepspeed_version
    if not isinstance(ds_config, dict):
        raise ValueError(f"expected ds_config to be a dict, got {type(ds_config).__name__}")
    if KEY not in ds_config:
        raise ElasticityConfigError(f"'{KEY}' is missing from the config; add the section "
                                    "(max_train_batch_size, micro_batch_sizes, ...)")
    if not elasticity_enabled(ds_config):
        raise ElasticityConfigError(f"{KEY}.enabled is false; set it true to compute the "
                                    "elastic batch size")
    sec = _section(ds_config[KEY])
    solved = Elastic(sec)
    if not solved.valid_sizes:
        raise ElasticityConfigError(f"{KEY}: no data-parallel size fits; {solved.describe()}")
    if world_size == 0 and float(sec["version"]) == 0.2 and return_microbatch:
        world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
    if world_size > 0:
        dp = world_size // int(sec["model_parallel_size"]) if solved.version == 0.2 else world_size
        micro, _gas, batch, problem = solved.split(dp)
        if problem:
            raise ElasticityIncompatibleWorldSize(problem)
        return batch, solved.valid_sizes, micro
    if return_microbatch:
        raise ElasticityConfigError("return_microbatch needs the world size: pass world_size= "
                                    "(or set WORLD_SIZE for version 0.2)")
    return solved.batch, solved.valid_sizes


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict) -> None:
    """The section the job runs with keeps the batch-defining keys of the one the scheduler saw
    (``DEEPSPEED_ELASTICITY_CONFIG``); without that variable there is nothing to compare."""
    seen = os.environ.get(ENV)
    if seen is None:
        return
    scheduler, runtime = _section(json.loads(seen)), _section(runtime_elastic_config_dict)
    for key in ("max_train_batch_size", "micro_batch_sizes", "version"):
        if scheduler[key] != runtime[key]:
            raise ElasticityConfigError(f"{KEY}.{key}: {runtime[key]!r} here, but the resource "
                                        f"scheduler saw {scheduler[key]!r} ({ENV}); use the "
                                        "same section for both")
