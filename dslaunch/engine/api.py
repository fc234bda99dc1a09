"""The public training API, DeepSpeed's signatures: ``initialize``, ``init_distributed``,
``add_config_arguments``. A DeepSpeed script ports by changing ``import deepspeed`` to
``import dslaunch as deepspeed``.
"""

from __future__ import annotations

import argparse
import os

from dslaunch.engine.comm.collectives import init_distributed
from dslaunch.engine.comm.membership import await_promotion, init_private_world, join_word
from dslaunch.engine.core.engine_config import resolve

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


def _arg(args, name: str):
    """``args.name``: ``args`` may be an argparse.Namespace, a dict (OpenRLHF passes one) or
    None."""
    if isinstance(args, dict):
        return args.get(name)
    return getattr(args, name, None)


def _config_source(args, config, config_params):
    in_args = [(value, f"args.{attr}") for attr in ("deepspeed_config", "deepscale_config")
               if (value := _arg(args, attr))]
    given = [(value, label) for value, label in ((config, "config="),
                                                 (config_params, "config_params="))
             if value is not None]
    if in_args and given:  # DeepSpeed refuses this too (Megatron clears args first)
        raise ValueError(f"dslaunch.initialize: the config is given twice, as {given[0][1]} and "
                         f"as {in_args[0][1]} ({in_args[0][0]!r}); pass only one")
    if given or in_args:
        return (given or in_args)[0]
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV], CONFIG_ENV
    raise ValueError(
        "dslaunch.initialize: no config; pass config= (a dict or a file path), "
        "--deepspeed_config FILE (see dslaunch.add_config_arguments), or start the script with "
        "`dslaunch run --config FILE ...`")


def _config_origin(label: str):
    """The file name to show in config errors when the config came from the launcher."""
    return os.environ.get("DSLAUNCH_CONFIG_PATH") if label == CONFIG_ENV else None


def _configure_activation_checkpointing(resolved, layout) -> None:
    """A config that writes a key of ``activation_checkpointing`` configures
    ``dslaunch.checkpointing`` for this job (its tensor-parallel group from the job's layout);
    without one the module is left as the script configured it."""
    if not any(source == "file" for path, source in resolved.sources.items()
               if path.startswith("activation_checkpointing.")):
        return
    from dslaunch.engine.features.activation_checkpoint import configure

    section = resolved.typed.activation_checkpointing
    configure(layout, partition_activations=section.partition_activations,
              contiguous_checkpointing=section.contiguous_memory_optimization,
              num_checkpoints=section.number_checkpoints,
              checkpoint_in_cpu=section.cpu_checkpointing,
              synchronize=section.synchronize_checkpoint_boundary, profile=section.profile)


def _resplit_parameters(model, model_parameters):
    """``model_parameters`` given before AutoTP replaced the split layers' parameters: the
    model's trainable parameters now (param groups are kept only when nothing was replaced)."""
    given = list(model_parameters)
    live = {id(p) for p in model.parameters()}
    if all(id(p) in live for g in given
           for p in (g["params"] if isinstance(g, dict) else [g])):
        return given
    if any(isinstance(g, dict) for g in given):
        raise ValueError("dslaunch.initialize: with tensor_parallel.autotp_size, pass "
                         "model_parameters=None (or the param groups after tp_model_init "
                         "and initialize split the model); the groups name unsplit parameters")
    return [p for p in model.parameters() if p.requires_grad]


_BF16_WARNED = []


def warn_slow_bf16_on_cpu() -> str | None:
    """A bf16 job whose device is a CPU without native bf16 instructions: one warning on rank 0
    before the first step (once per process), naming the missing flags and the measured cost
    (kernels/cpu_features.py). Returns the message (None: nothing to say)."""
    from dslaunch.accelerator import get_accelerator
    from dslaunch.kernels.cpu_features import slow_bf16_warning

    if get_accelerator().device_name() != "cpu":
        return None
    message = slow_bf16_warning()
    if message and not _BF16_WARNED:
        _BF16_WARNED.append(message)
        import logging

        from dslaunch.engine.base.log import log_dist

        log_dist(message, ranks=[0], level=logging.WARNING)
    return message


def _prewarm() -> None:
    """What a standby process imports while it waits to be promoted (``membership.await_promotion``):
    torch's compiler, which torch.optim's first Optimizer imports, and the engine's modules."""
    try:  # only a head start: the real imports report any error
        import torch._dynamo  # noqa: F401

        from dslaunch import config  # noqa: F401
        from dslaunch.engine.core.engine import DSLaunchEngine  # noqa: F401
        from dslaunch.engine.core.pipe_engine import PipelineEngine  # noqa: F401
        from dslaunch.engine.parallel.sequence.layout import sequence_parallel_mpu  # noqa: F401
        from dslaunch.engine.recovery.inprocess import InProcessRecovery  # noqa: F401
    except Exception:
        pass


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, config_params=None):
    """Build the engine. Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``
    (the dataloader is None without ``training_data``; the scheduler None without one; the
    optimizer None when neither ``optimizer=`` nor the config names one: the engine then runs
    forward only, for evaluation or a frozen reference model). ``args``: an argparse.Namespace
    or a dict; ``config_params=`` is another name for ``config=``."""
    if model is None:
        raise ValueError("dslaunch.initialize: model= is required")
    await_promotion(prewarm=_prewarm)  # a standby process: until it replaces a lost rank
    source, label = _config_source(args, config, config_params)
    if join_word():  # a replacement rank: built alone, then joins the survivors (recovery.start)
        init_private_world()
    init_distributed(dist_init_required=dist_init_required)
    from dslaunch.engine.parallel.autotp import autotp_mpu
    from dslaunch.engine.parallel.sequence.layout import config_sequence_parallel_size, sequence_parallel_mpu

    # tensor_parallel.autotp_size (or tp_model_init): the data x model grid, world / N data ranks
    # (the batch triad counts all N x data ranks, as DeepSpeed's; tp ranks share their samples)
    mpu, autotp, grid_ours = autotp_mpu(source, model, mpu, config_sequence_parallel_size(source))
    mpu = sequence_parallel_mpu(source, model, mpu)  # sequence_parallel_size: its grid
    resolved = resolve(source, model, mpu, _config_origin(label), batch_counts_tp=grid_ours)
    cfg = resolved.typed
    if autotp > 1:  # the model's attention and MLP linears split over the grid's model group
        from dslaunch.engine.parallel.autotp import apply_autotp

        apply_autotp(model, mpu.get_model_parallel_group(), cfg.tensor_parallel)
        if model_parameters is not None:  # the caller's list names the unsplit parameters
            model_parameters = _resplit_parameters(model, model_parameters)
    if cfg.bf16.enabled:
        warn_slow_bf16_on_cpu()
    if cfg.expert_parallel.enabled:  # AutoEP: the model's experts become expert-parallel ones
        from dslaunch.engine.parallel.moe.auto_ep import autoep_from_config

        model_parameters = autoep_from_config(model, cfg.expert_parallel, model_parameters)
    from dslaunch.engine.parallel.pipe.module import PipelineModule
    from dslaunch.engine.recovery.inprocess import recovery_for_this_rank

    recovery = recovery_for_this_rank()  # handed to the engine, which calls it at its seams
    common = dict(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                  training_data=training_data, lr_scheduler=lr_scheduler, collate_fn=collate_fn,
                  cfg=cfg, recovery=recovery)
    if isinstance(model, PipelineModule):
        from dslaunch.engine.core.pipe_engine import PipelineEngine

        engine = PipelineEngine(**common)
    elif mpu is not None:  # tensor / sequence parallel: gradients reduced over the mpu's group
        from dslaunch.engine.core.pipe_engine import tensor_parallel_engine

        engine = tensor_parallel_engine(mpu=mpu, **common)
    else:
        from dslaunch.engine.comm.collectives import Comm
        from dslaunch.engine.core.engine import DSLaunchEngine

        engine = DSLaunchEngine(comm=Comm(), **common)
    recovery.attach(engine)
    from dslaunch.engine.parallel.groups import set_layout

    # dslaunch.utils.groups answers for the layout of the last engine built
    layout = model.grid if isinstance(model, PipelineModule) else mpu
    set_layout(layout)
    _configure_activation_checkpointing(resolved, layout)
    engine._config_source = (source, _config_origin(label))  # an in-process resize re-reads it
    recovery.start(engine)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
