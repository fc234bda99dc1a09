"""``dslaunch top --log-dir DIR``: the live table of a job started with ``dslaunch run --log-dir
DIR``, from another terminal (or host sharing DIR), and its straggler report on demand.

It reads ``DIR/status.json``, which the job's launcher replaces atomically about once a second
(``launcher/jobview.py``): no connection to the job, nothing it can disturb.
"""

from __future__ import annotations

import sys
import time

import click

STALE = 5.0  # a running job's status older than this: its launcher may be gone


def _headline(status: dict, age: float) -> str:
    state = status.get("state", "?")
    if state == "running" and age > STALE:
        return (f"job status {age:.0f} s old (launcher pid {status.get('launcher_pid')}): the "
                "launcher may be gone")
    return f"job {state} (attempt {status.get('attempt', 0)}), status {age:.1f} s old"


@click.command("top", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-dir", "log_dir", required=True, type=click.Path(file_okay=False),
              help="The --log-dir of the job (dslaunch run --log-dir DIR): its status.json is read.")
@click.option("--once", is_flag=True,
              help="Print the table once and exit (the default when stdout is not a terminal).")
@click.option("--stragglers", is_flag=True,
              help="Print the straggler report (ranks whose compute per step is more than the "
                   "threshold above the median, and where their extra time goes) and exit.")
@click.option("--threshold", type=click.FloatRange(min=0), default=None,
              help="Straggler threshold, a fraction above the median (default: the job's "
                   "--straggler-threshold).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between redraws.")
def top(log_dir, once, stragglers, threshold, interval):
    """Show the ranks of a running job: host, step, step time (compute and in collectives),
    tokens/s, memory, last heartbeat, state; redrawn until the job ends (Ctrl-C leaves).

    It reads DIR/status.json, which the launcher of a job started with `dslaunch run --log-dir
    DIR` replaces (atomically) about once a second: nothing connects to the job.
    """
    from dslaunch.launcher import jobview
    from dslaunch.launcher import stragglers as straggler_report
    from dslaunch.launcher.live_table import console, table

    status = jobview.read_status(log_dir)
    if status is None:
        raise click.ClickException(f"no job status in {log_dir} ({jobview.STATUS_FILE}): start the "
                                   f"job with `dslaunch run --log-dir {log_dir} ...`")
    out = console(sys.stdout)

    def threshold_of(st: dict) -> float:
        if threshold is not None:
            return threshold
        value = st.get("threshold")
        return straggler_report.DEFAULT_THRESHOLD if value is None else value

    def render(st: dict):
        age = max(0.0, time.time() - st.get("time", time.time()))
        return table(st["ranks"], _headline(st, age), age_offset=age)

    if stragglers:
        click.echo(straggler_report.report(status["job"], threshold_of(status)))
        return
    if once or not out.is_terminal:
        out.print(render(status))
        return
    from rich.live import Live

    try:
        with Live(render(status), console=out, auto_refresh=False) as live:
            while status.get("state") == "running":
                time.sleep(interval)
                status = jobview.read_status(log_dir) or status
                live.update(render(status), refresh=True)
    except KeyboardInterrupt:
        return
    click.echo(straggler_report.report(status["job"], threshold_of(status)))
