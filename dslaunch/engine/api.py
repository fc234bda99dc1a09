"""The public training API, DeepSpeed's signatures: ``initialize``, ``init_distributed``,
``add_config_arguments``. A DeepSpeed script ports by changing ``import deepspeed`` to
``import dslaunch as deepspeed``.
"""

from __future__ import annotations

import argparse
import os

from .comm import init_distributed  # noqa: F401  (re-exported)

CONFIG_ENV = "DSLAUNCH_CONFIG"


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's flags: ``--deepspeed``, ``--deepspeed_config`` (also spelled ``--config``
    when the script has no ``--config`` of its own), the old ``--deepscale`` /
    ``--deepscale_config`` aliases, and ``--local_rank`` if the script did not declare it (a
    rank learns its local rank from the environment; the flag is accepted for old scripts)."""
    group = parser.add_argument_group("dslaunch", "dslaunch / DeepSpeed configuration")
    taken = set(parser._option_string_actions)
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="enable the dslaunch runtime (accepted for DeepSpeed scripts)")
    names = ["--deepspeed_config"] + (["--config"] if "--config" not in taken else [])
    group.add_argument(*names, dest="deepspeed_config", default=None, type=str,
                       help="DeepSpeed-style JSON/YAML config file")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    if "--local_rank" not in taken and "--local-rank" not in taken:
        group.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int,
                           default=int(os.environ.get("LOCAL_RANK", -1)),
                           help="set by old launchers; dslaunch passes LOCAL_RANK in the env")
    return parser


def _config_source(args, config, config_params):
    if config is not None:
        return config, "config="
    if config_params is not None:
        return config_params, "config_params="
    for attr in ("deepspeed_config", "deepscale_config"):
        value = getattr(args, attr, None) if args is not None else None
        if value:
            return value, f"args.{attr}"
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV], CONFIG_ENV
    raise ValueError(
        "dslaunch.initialize: no config; pass config= (a dict or a file path), "
        "--deepspeed_config FILE (see dslaunch.add_config_arguments), or start the script with "
        "`dslaunch run --config FILE ...`")


def resolve_engine_config(source, world_size: int, model_num_params: int | None = None):
    """The resolved config (``dslaunch.config.ResolvedConfig``) for this job."""
    from dslaunch.config import resolve_config

    return resolve_config(source, world_size=world_size, dp_world_size=world_size,
                          model_num_params=model_num_params)


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, config_params=None):
    """Build the engine. Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``
    (the dataloader is None without ``training_data``; the scheduler None without one)."""
    if model is None:
        raise ValueError("dslaunch.initialize: model= is required")
    source, _ = _config_source(args, config, config_params)
    init_distributed(dist_init_required=dist_init_required)
    from .pipe.module import PipelineModule

    if mpu is not None or isinstance(model, PipelineModule):  # pipeline / tensor parallel
        from .pipe.engine import initialize_parallel

        engine = initialize_parallel(args, model, optimizer, model_parameters, training_data,
                                     lr_scheduler, mpu, collate_fn, source)
        return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
    import torch.distributed as dist

    from .comm import Comm
    from .engine import DSLaunchEngine

    comm = Comm()
    num_params = sum(p.numel() for p in model.parameters())
    cfg = resolve_engine_config(source, dist.get_world_size(), num_params)
    engine = DSLaunchEngine(args=args, model=model, optimizer=optimizer,
                            model_parameters=model_parameters, training_data=training_data,
                            lr_scheduler=lr_scheduler, collate_fn=collate_fn, cfg=cfg, comm=comm)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
