"""``dslaunch config validate|show``: check a config, or print it fully resolved with the source of
every value (file, default, inferred, auto) so users can tell which value won."""

from __future__ import annotations

import json
import sys

import click

from dslaunch.config import ConfigError, resolve_config

_WORLD = click.option("--world-size", type=click.IntRange(min=1), default=None,
                      help="Data-parallel world size used to resolve the batch triad.")


@click.group("config")
def config():
    """Validate or show a DeepSpeed-style config (JSON or YAML)."""


def _resolve_or_exit(file: str, world_size):
    try:
        return resolve_config(file, world_size=world_size)
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
def validate(file, world_size):
    """Check FILE; print every problem (exit 1) or a one-line summary."""
    cfg = _resolve_or_exit(file, world_size)
    batch = (f"train_batch_size={_fmt(cfg.train_batch_size)}, micro={_fmt(cfg.train_micro_batch_size_per_gpu)}, "
             f"grad_accum={_fmt(cfg.gradient_accumulation_steps)}")
    where = f"world size {world_size}" if world_size else "no --world-size given"
    click.echo(f"{file}: OK ({where}: {batch})")
    for note in cfg.notes:
        click.echo(f"  note: {note}")


@config.command("show")
@click.argument("file")
@_WORLD
@click.option("--json", "as_json", is_flag=True, help="Print JSON: values, sources, notes.")
@click.option("--no-defaults", is_flag=True, help="Hide values that are DeepSpeed's defaults.")
def show(file, world_size, as_json, no_defaults):
    """Print FILE fully resolved, each value marked with where it came from."""
    cfg = _resolve_or_exit(file, world_size)
    rows = [(path, value, _source_of(cfg.sources, path)) for path, value in _flatten(cfg.values)]
    if no_defaults:
        rows = [row for row in rows if row[2] != "default"]
    if as_json:
        click.echo(json.dumps({"file": file, "world_size": world_size, "values": cfg.values,
                               "sources": {path: source for path, _, source in rows},
                               "notes": cfg.notes}, indent=2))
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
    return "depends on world size" if value is None else str(value)
