"""``dslaunch estimate-memory``: model-state memory per rank and per host for each ZeRO stage.

Nothing here imports torch unless ``--model-script`` asks to count a model's parameters (built on
the meta device, so even a huge model costs no memory).
"""

from __future__ import annotations

import json
import re

import click

from dslaunch.launcher.text_table import text_table

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _parse_count(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgtKMBGT]?)\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a parameter count (e.g. 125000000, 1.3B, 27M)")
    return int(round(float(m.group(1)) * _SUFFIX[m.group(2).lower()]))


def _count_script_params(path: str) -> int:
    import runpy

    import torch

    try:
        ns = runpy.run_path(path, run_name="__dslaunch_estimate__")
    except Exception as exc:  # the user's script: report, do not trace
        raise click.ClickException(f"--model-script {path}: {type(exc).__name__}: {exc}") from None
    for name in ("build_model", "get_model", "model_fn", "make_model"):
        if callable(ns.get(name)):
            with torch.device("meta"):
                model = ns[name]()
            break
    else:
        model = ns.get("model")
        if not isinstance(model, torch.nn.Module):
            raise click.ClickException(
                f"--model-script {path}: define build_model() returning an nn.Module (or a "
                "module-level `model`)")
    return sum(p.numel() for p in model.parameters())


def _from_config(path: str, world_size: int) -> dict:
    """The stage, precision, offload and optimizer the config asks for (resolved as a run would)."""
    from dslaunch.config import ConfigError, resolve_config

    try:
        cfg = resolve_config(path, world_size=world_size, require_batch=False,
                             autos="describe").typed
    except ConfigError as exc:
        raise click.ClickException(f"invalid config {path}:\n  " + "\n  ".join(exc.lines())) \
            from None
    zero = cfg.zero_optimization
    # an "auto" precision (the Trainer's --bf16 fills it) counts as fp32 here; --precision picks
    precision = "bf16" if cfg.bf16.enabled is True else "fp16" if cfg.fp16.enabled is True else "fp32"
    stage = zero.stage if isinstance(zero.stage, int) else 0
    optimizer = (cfg.optimizer.type if cfg.optimizer is not None else "adam").lower()
    return {"stage": stage, "precision": precision,
            "offload_optimizer": zero.offload_optimizer.device,
            "offload_param": zero.offload_param.device, "optimizer": optimizer,
            "hpz": zero.zero_hpz_partition_size, "mics": zero.mics_shard_size}


@click.command("estimate-memory")
@click.option("--params", "params", default=None, help="Number of parameters (125000000, 1.3B, 27M).")
@click.option("--model-script", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Python file defining build_model(); its parameters are counted on the meta device.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A dslaunch/DeepSpeed config: its precision, stage and offload are marked.")
@click.option("--world-size", "--num-gpus", "world_size", type=click.IntRange(min=1), required=True,
              help="Data-parallel ranks.")
@click.option("--ranks-per-host", "--gpus-per-node", "--num_gpus_per_node", "ranks_per_host",
              type=click.IntRange(min=1), default=None,
              help="Ranks on each host (default: all on one host).")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default=None,
              help="Parameter/gradient precision (default bf16, or the config's).")
@click.option("--optimizer", default=None, help="adam (default), adamw, lamb, sgd, sgd-momentum, ...")
@click.option("--stage", type=click.IntRange(0, 3), default=None, help="Only this stage.")
@click.option("--offload-optimizer", type=click.Choice(["none", "cpu", "nvme"]), default=None,
              help="Only rows with this optimizer offload.")
@click.option("--offload-param", type=click.Choice(["none", "cpu", "nvme"]), default=None,
              help="Only rows with this parameter offload.")
@click.option("--hpz-partition-size", "hpz", type=click.IntRange(min=1), default=None,
              help="ZeRO++ hpZ secondary partition size for the stage-3 rows (default: the "
                   "config's zero_hpz_partition_size, else 1).")
@click.option("--mics-shard-size", "mics", type=int, default=None,
              help="MiCS shard size for the stage-3 rows (default: the config's "
                   "mics_shard_size, else none).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def estimate_memory(params, model_script, config_path, world_size, ranks_per_host, precision,
                    optimizer, stage, offload_optimizer, offload_param, hpz, mics, as_json):
    """Per-rank and per-host bytes of parameters, gradients and optimizer states for ZeRO 0-3."""
    from dslaunch.engine.zero.memory_estimate import OPTIMIZER_STATES, all_estimates, human

    if (params is None) == (model_script is None):
        raise click.UsageError("give exactly one of --params or --model-script")
    num_params = _parse_count(params) if params is not None else _count_script_params(model_script)
    cfg = _from_config(config_path, world_size) if config_path else None
    precision = precision or (cfg["precision"] if cfg else "bf16")
    optimizer = (optimizer or (cfg["optimizer"] if cfg else "adam")).lower()
    if optimizer not in OPTIMIZER_STATES:
        raise click.ClickException(
            f"--optimizer {optimizer}: unknown; one of {', '.join(sorted(OPTIMIZER_STATES))}")
    per_host = ranks_per_host or world_size
    if per_host > world_size:
        raise click.UsageError(f"--ranks-per-host {per_host} is more than --world-size {world_size}")

    hpz = hpz if hpz is not None else (cfg["hpz"] if cfg else 1)
    mics = mics if mics is not None else (cfg["mics"] if cfg else -1)
    if hpz > 1 and mics > 0:
        raise click.UsageError("hpZ and MiCS are two ways to partition within groups: give one")
    try:
        rows = all_estimates(num_params, world_size, precision, optimizer, hpz, mics)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if stage is not None:
        rows = [r for r in rows if r.stage == stage]
    if offload_optimizer is not None:
        rows = [r for r in rows if r.offload_optimizer == offload_optimizer]
    if offload_param is not None:
        rows = [r for r in rows if r.offload_param == offload_param]
    if not rows:
        raise click.UsageError("no stage matches these options (offload_param needs stage 3, "
                               "offload_optimizer stage >= 1)")

    def chosen(r):
        return bool(cfg) and (r.stage, r.offload_optimizer, r.offload_param) == (
            cfg["stage"], cfg["offload_optimizer"], cfg["offload_param"])

    if as_json:
        out = {"params": num_params, "world_size": world_size, "ranks_per_host": per_host,
               "precision": precision, "optimizer": optimizer,
               "estimates": [dict(r.to_dict(per_host), config=chosen(r)) for r in rows]}
        click.echo(json.dumps(out, indent=2))
        return

    click.echo(f"Model states for {num_params:,} parameters, {world_size} data-parallel ranks "
               f"({per_host} per host), {precision}, {optimizer}:")
    table = [("", "per rank device", "per rank cpu", "per host device", "per host cpu",
              "per rank nvme", "")]
    for r in rows:
        table.append((r.label(), human(r.device), human(r.cpu), human(r.device * per_host),
                      human(r.cpu * per_host), human(r.nvme), "<- config" if chosen(r) else ""))
    for line in text_table(table, align="<>>>>>", indent="  "):
        click.echo(line)
    click.echo("  (activations and communication buffers come on top; on a CPU-only host "
               "'device' memory is host memory too)")
