"""``dslaunch nvme-tune``: sweep the async I/O op's settings on real files, print a results table,
the best read and write settings, and the ``aio`` config section to paste (DeepSpeed's
``ds_nvme_tune``). The sweep itself is :mod:`dslaunch.nvme.tune`; this module is the command line,
the progress bar, the table and signal handling (torch is imported only when the sweep runs).

``ds_nvme_tune``'s flags are accepted as typed, with the same meaning (``--nvme_dir``,
``--sweep_config``, ``--io_size``, ``--no_read``, ``--no_write``, ``--loops``, ``--log_dir``,
``--flush_page_cache``, ``--verbose``); ``--gpu`` and ``--gds`` are refused with the reason
(dslaunch's handle moves host memory only).
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
@click.option("--nvme-dir", "--nvme_dir", "nvme_dirs", multiple=True, required=True, metavar="DIR [DIR...]",
              help="Directory (on the NVMe device) to put the test files in; repeat, or list "
                   "several after one flag. --io-size is split evenly over them.")
@click.argument("more_dirs", nargs=-1, metavar="", required=False)
@click.option("--io-size", "--io_size", default="256M", show_default=True,
              help="Bytes moved per trial (e.g. 64M, 1G), split over the directories.")
@click.option("--sweep-config", "--sweep_config", type=click.Path(dir_okay=False),
              help="JSON/YAML {key: [values]} over block_size, queue_depth, intra_op_parallelism "
                   "(or io_parallel), single_submit, overlap_events; keys left out keep the "
                   "default. Without it, DeepSpeed's 144-setting grid.")
@click.option("--loops", default=1, show_default=True, type=click.IntRange(1),
              help="Repeats per setting (bandwidth is the median).")
@click.option("--no-read", "--no_read", is_flag=True, help="Skip the read sweep.")
@click.option("--no-write", "--no_write", is_flag=True, help="Skip the write sweep.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (results, best, aio).")
@click.option("--log-dir", "--log_dir", type=click.Path(file_okay=False),
              help="Also write the results (the --json object) to DIR/nvme_tune.json, and one "
                   "line per timed run to DIR/nvme_tune_runs.log.")
@click.option("--flush-page-cache", "--flush_page_cache", is_flag=True,
              help="Evict the test files from the page cache before each timed read (matters "
                   "where O_DIRECT is refused; no root needed).")
@click.option("--verbose", "-v", is_flag=True, help="Print the arguments and every timed run.")
@click.option("--gpu", is_flag=True, help="DeepSpeed's flag; refused: the handle moves host memory.")
@click.option("--gds", is_flag=True, help="DeepSpeed's flag; refused: no GPUDirect Storage op.")
def nvme_tune(nvme_dirs, more_dirs, io_size, sweep_config, loops, no_read, no_write, as_json,
              log_dir, flush_page_cache, verbose, gpu, gds):
    """Find the best async I/O settings for NVMe offload on these directories."""
    from dslaunch.nvme import tune

    if gpu or gds:
        raise click.UsageError(
            f"--{'gds' if gds else 'gpu'}: dslaunch's async I/O handle moves host (CPU) memory "
            "only; it has no GPU-to-NVMe path (GPUDirect Storage). Drop the flag: the sweep of "
            "host transfers picks the aio section that ZeRO-Infinity's NVMe offload uses")
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

    if verbose:
        click.echo(f"nvme-tune: dirs {[str(t.path) for t in targets]}, io size {size} bytes, "
                   f"{len(configs)} settings x {ops} x {loops} loop(s), flush_page_cache "
                   f"{flush_page_cache}, log_dir {log_dir}", err=True)
    runs_log = _open_log(log_dir, "nvme_tune_runs.log")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = _run(tune, targets, size, configs, ops, loops, flush_page_cache,
                      _trial_printer(tune, verbose, runs_log))
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
        if runs_log is not None:
            runs_log.close()
    if log_dir:
        with open(f"{log_dir}/nvme_tune.json", "w") as f:
            json.dump(result, f, indent=1)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        _print_human(result)


def _open_log(log_dir, name):
    if not log_dir:
        return None
    import os

    try:
        os.makedirs(log_dir, exist_ok=True)
        return open(os.path.join(log_dir, name), "w")
    except OSError as exc:
        raise click.ClickException(f"--log_dir {log_dir}: {exc.strerror}") from None


def _trial_printer(tune, verbose, log):
    """on_trial for --verbose (stderr) and --log_dir (a file): one line per timed run."""
    if not verbose and log is None:
        return None

    def say(trial, done, total):
        c = trial.config
        line = (f"[{done}/{total}] {trial.op} block_size={c['block_size']} queue_depth="
                f"{c['queue_depth']} intra_op_parallelism={c['intra_op_parallelism']} "
                f"single_submit={c['single_submit']} overlap_events={c['overlap_events']}: "
                f"{trial.seconds[-1]:.6f} s, {trial.nbytes / trial.seconds[-1] / 1e9:.3f} GB/s")
        if verbose:
            click.echo(line, err=True)
        if log is not None:
            log.write(line + "\n")
    return say


def _run(tune, targets, size, configs, ops, loops, flush_page_cache, also=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with tune.Sweep(targets, size, configs, ops, loops, flush_page_cache) as sweep:
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
                if also is not None:
                    also(trial, done, total)

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
