"""``dslaunch nvme-tune``: sweep the async I/O op's settings on real files, print a results table,
the best read and write settings, and the ``aio`` config section to paste (DeepSpeed's
``ds_nvme_tune``). The sweep itself is :mod:`dslaunch.nvme.tune`; this module is the command line,
the progress bar, the table and signal handling (torch is imported only when the sweep runs).
"""

from __future__ import annotations

import json
import signal
import sys

import click


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that the sweep's ``finally`` removes its files."""


def _on_sigterm(signum, frame):
    raise _Terminated()


@click.command("nvme-tune")
@click.option("--nvme-dir", "nvme_dirs", multiple=True, required=True, metavar="DIR [DIR...]",
              help="Directory (on the NVMe device) to put the test files in; repeat, or list "
                   "several after one flag. --io-size is split evenly over them.")
@click.argument("more_dirs", nargs=-1, metavar="", required=False)
@click.option("--io-size", default="256M", show_default=True,
              help="Bytes moved per trial (e.g. 64M, 1G), split over the directories.")
@click.option("--sweep-config", type=click.Path(dir_okay=False),
              help="JSON/YAML {key: [values]} over block_size, queue_depth, intra_op_parallelism "
                   "(or io_parallel), single_submit, overlap_events; keys left out keep the "
                   "default. Without it, DeepSpeed's 144-setting grid.")
@click.option("--loops", default=1, show_default=True, type=click.IntRange(1),
              help="Repeats per setting (bandwidth is the median).")
@click.option("--no-read", is_flag=True, help="Skip the read sweep.")
@click.option("--no-write", is_flag=True, help="Skip the write sweep.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (results, best, aio).")
def nvme_tune(nvme_dirs, more_dirs, io_size, sweep_config, loops, no_read, no_write, as_json):
    """Find the best async I/O settings for NVMe offload on these directories."""
    from dslaunch.nvme import tune

    if no_read and no_write:
        raise click.UsageError("--no-read and --no-write leave nothing to measure")
    try:
        size = tune.parse_size(io_size)
        sweep = tune.load_sweep(sweep_config) if sweep_config else dict(tune.DEFAULT_SWEEP)
        targets = tune.check_dirs([*nvme_dirs, *more_dirs], size)
    except tune.TuneError as exc:
        raise click.ClickException(str(exc)) from None
    ops = tuple(op for op, skip in (("write", no_write), ("read", no_read)) if not skip)
    configs = tune.grid(sweep)

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = _run(tune, targets, size, configs, ops, loops, as_json)
    except KeyboardInterrupt:
        click.echo("nvme-tune: interrupted; its files were removed", err=True)
        sys.exit(130)
    except _Terminated:
        click.echo("nvme-tune: terminated; its files were removed", err=True)
        sys.exit(143)
    except OSError as exc:
        raise click.ClickException(f"I/O failed: {exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        _print_human(result)


def _run(tune, targets, size, configs, ops, loops, as_json) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with tune.Sweep(targets, size, configs, ops, loops) as sweep:
        progress = Progress(TextColumn("[bold]nvme-tune"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=console, transient=True)
        with progress:
            task = progress.add_task("writing the test files", total=sweep.total_runs())
            sweep.prepare()

            def on_trial(trial, done, total):
                c = trial.config
                progress.update(task, completed=done, description=(
                    f"{trial.op} bs={tune.human(c['block_size'])} qd={c['queue_depth']} "
                    f"t={c['intra_op_parallelism']} ss={int(c['single_submit'])} "
                    f"oe={int(c['overlap_events'])}: {trial.gbps:.2f} GB/s"))

            sweep.run(on_trial)
        return tune.summary(sweep)


def _print_human(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    for d in result["dirs"]:
        console.print(f"{d['path']}: {d['bytes']} bytes per trial, {d['io_mode']}")
    note = f" ({result['backend_note']})" if result["backend_note"] else ""
    console.print(f"backend: {result['backend']}{note}; io size {result['io_size']} bytes, "
                  f"{result['loops']} loop(s) per setting")
    table = Table(title="nvme-tune results (GB/s, median)")
    for col in ("op", "block_size", "queue_depth", "threads", "single", "overlap", "GB/s"):
        table.add_column(col, justify="left" if col == "op" else "right", no_wrap=True)
    rows = sorted(result["results"], key=lambda r: (r["op"], -r["gbps"]))
    for r in rows:
        table.add_row(r["op"], str(r["block_size"]), str(r["queue_depth"]),
                      str(r["intra_op_parallelism"]), str(r["single_submit"]).lower(),
                      str(r["overlap_events"]).lower(), f"{r['gbps']:.3f}")
    console.print(table)
    for op in ("read", "write"):
        b = result["best"][op]
        if b:
            console.print(f"best {op}: {b['gbps']:.3f} GB/s with block_size={b['block_size']} "
                          f"queue_depth={b['queue_depth']} intra_op_parallelism="
                          f"{b['intra_op_parallelism']} single_submit={str(b['single_submit']).lower()} "
                          f"overlap_events={str(b['overlap_events']).lower()}")
    console.print("aio config section (paste into your config):")
    click.echo(json.dumps({"aio": result["aio"]}, indent=2))
