"""``dslaunch config validate|show``: check a config, or print it fully resolved with the source of
every value (file, default, inferred, auto) so users can tell which value won."""

from __future__ import annotations

import json
import sys

import click

from dslaunch.config import ConfigError, resolve_config

_WORLD = click.option("--world-size", type=click.IntRange(min=1), default=None,
                      help="Data-parallel world size used to resolve the batch triad.")

# Values for "auto" keys, named after what fills them (dslaunch/config/auto.py FILLERS): with
# them, `show` prints what the Hugging Face Trainer or Accelerate would write.
_FILLS = (
    ("--hidden-size", "hidden_size", click.IntRange(min=1),
     "The model's hidden size: fills the ZeRO bucket sizes (h*h, 0.9*h*h, 10*h)."),
    ("--lr", "lr", click.FloatRange(min=0), "Learning rate (the Trainer's learning_rate)."),
    ("--micro-batch-size", "micro_batch_size", click.IntRange(min=1),
     "Per-GPU micro-batch (the Trainer's per_device_train_batch_size)."),
    ("--grad-accum", "grad_accum", click.IntRange(min=1), "Gradient accumulation steps."),
    ("--max-grad-norm", "max_grad_norm", click.FloatRange(min=0),
     "Gradient clipping (the Trainer's max_grad_norm)."),
    ("--adam-betas", "adam_betas", str, "Adam betas, as B1,B2 (the Trainer's adam_beta1/2)."),
    ("--adam-eps", "adam_eps", click.FloatRange(min=0), "Adam epsilon."),
    ("--weight-decay", "weight_decay", click.FloatRange(min=0), "Weight decay."),
    ("--precision", "precision", click.Choice(["fp32", "fp16", "bf16"]),
     "Fills fp16.enabled / bf16.enabled (the Trainer's --fp16 / --bf16)."),
    ("--warmup-min-lr", "warmup_min_lr", click.FloatRange(min=0),
     "Scheduler warmup_min_lr (the Trainer always writes 0)."),
    ("--warmup-steps", "warmup_steps", click.IntRange(min=0), "Scheduler warmup_num_steps."),
    ("--total-steps", "total_steps", click.IntRange(min=1), "Scheduler total_num_steps."),
    ("--zero-stage", "zero_stage", click.IntRange(0, 3),
     "ZeRO stage (Accelerate's DeepSpeedPlugin zero_stage)."),
)


def _fill_options(command):
    for flag, name, kind, text in reversed(_FILLS):
        command = click.option(flag, name, type=kind, default=None, help=text)(command)
    return command


def _fills(options: dict) -> dict:
    fills = {name: options.get(name) for _, name, _, _ in _FILLS}
    betas = fills["adam_betas"]
    if betas is not None:
        try:
            fills["adam_betas"] = [float(b) for b in betas.split(",")]
        except ValueError:
            fills["adam_betas"] = []
        if len(fills["adam_betas"]) != 2:
            raise click.BadParameter(f"{betas!r}: expected two numbers, e.g. 0.9,0.999",
                                     param_hint="--adam-betas")
    return fills


@click.group("config")
def config():
    """Validate or show a DeepSpeed-style config (JSON or YAML)."""


def _resolve_or_exit(file: str, world_size, fills: dict):
    try:
        return resolve_config(file, world_size=world_size, autos="describe", fills=fills)
    except ConfigError as err:
        lines = err.lines()
        for line in lines:
            click.echo(line, err=True)
        if len(lines) > 1:
            click.echo(f"{file}: {len(lines)} problems", err=True)
        sys.exit(1)


@config.command("validate")
@click.argument("file")
@_WORLD
@_fill_options
def validate(file, world_size, **fills):
    """Check FILE; print every problem (exit 1) or a one-line summary, then one line per "auto"
    value saying who fills it (the Hugging Face Trainer, Accelerate or the engine)."""
    cfg = _resolve_or_exit(file, world_size, _fills(fills))
    batch = (f"train_batch_size={_fmt(cfg.train_batch_size)}, micro={_fmt(cfg.train_micro_batch_size_per_gpu)}, "
             f"grad_accum={_fmt(cfg.gradient_accumulation_steps)}")
    where = f"world size {world_size}" if world_size else "no --world-size given"
    click.echo(f"{file}: OK ({where}: {batch})")
    for note in cfg.notes:
        click.echo(f"  note: {note}")
    for line in cfg.auto_lines:
        click.echo(f"  auto: {line}")


@config.command("show")
@click.argument("file")
@_WORLD
@click.option("--json", "as_json", is_flag=True, help="Print JSON: values, sources, notes.")
@click.option("--no-defaults", is_flag=True, help="Hide values that are DeepSpeed's defaults.")
@_fill_options
def show(file, world_size, as_json, no_defaults, **fills):
    """Print FILE fully resolved, each value marked with where it came from; an "auto" value
    stays "auto" unless an option below gives it."""
    cfg = _resolve_or_exit(file, world_size, _fills(fills))
    rows = [(path, value, _source_of(cfg.sources, path)) for path, value in _flatten(cfg.values)]
    if no_defaults:
        rows = [row for row in rows if row[2] != "default"]
    if as_json:
        click.echo(json.dumps({"file": file, "world_size": world_size, "values": cfg.values,
                               "sources": {path: source for path, _, source in rows},
                               "notes": cfg.notes, "autos": cfg.auto_lines}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{file} (world size {world_size or 'not given'})")
    table.add_column("key")
    table.add_column("value")
    table.add_column("source")
    styles = {"file": "bold", "default": "dim", "inferred": "cyan", "auto": "magenta"}
    for path, value, source in rows:
        table.add_row(path, json.dumps(value), source, style=styles.get(source))
    console = Console()
    console.print(table)
    for note in cfg.notes:
        console.print(f"note: {note}")
    for line in cfg.auto_lines:
        console.print(f"auto: {line}", markup=False)


def _flatten(values: dict, prefix: str = ""):
    """(dotted path, leaf value); an empty or None section is one row."""
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value:
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _source_of(sources: dict, path: str) -> str:
    """A leaf inside a free-form value takes the source of the nearest key that has one."""
    while path:
        if path in sources:
            return sources[path]
        path = path.rpartition(".")[0]
    return "default"


def _fmt(value) -> str:
    return "depends on world size" if value is None else str(value)  # or "auto"
