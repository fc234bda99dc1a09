"""``dslaunch hosts check -H HOSTFILE [--json]``: probe every host in parallel and report.

Each host is checked the way ``dslaunch run`` with the same hostfile (and ``--launcher``) would
reach it: the launcher is chosen by the same rule (``deepspeed_flags.launcher_name``: local when
every host is this one, else pdsh when installed, else ssh), and the probe goes over that runner's
``probe_transport`` (this host itself for the local launcher; ssh for ssh, pdsh and MPI; srun for
slurm). The table and the JSON say which (``via``).
"""

from __future__ import annotations

import json
import sys

import click


@click.group("hosts", context_settings={"help_option_names": ["-h", "--help"]})
def hosts():
    """Inspect the hosts of a hostfile."""


@hosts.command("check")
@click.option("-H", "--hostfile", type=click.Path(dir_okay=False), default=None,
              help="MPI-style hostfile (default /job/hostfile).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.option("--timeout", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="Seconds each host gets to answer.")
@click.option("--python", "python", default=None,
              help="Interpreter to probe on each host (default: the one running dslaunch).")
@click.option("--launcher", default=None,
              help="Check the hosts as `dslaunch run --launcher NAME` would reach them. Default: "
                   "run's choice (local when every host is this one, else pdsh when installed, "
                   "else ssh).")
@click.option("--master-port", "--master_port", "master_port", type=click.IntRange(1, 65535),
              default=None, help="Port that must be free on the first host (default 29500 for "
                                 "a multi-host launcher; for the local launcher none is checked "
                                 "unless given: run picks a free port).")
@click.option("--ssh-port", type=click.IntRange(1, 65535), default=None, help="sshd port of the hosts.")
@click.option("--ssh-args", default=None, metavar="ARGS", help="Extra ssh client arguments.")
def check(hostfile, as_json, timeout, python, launcher, master_port, ssh_port, ssh_args):
    """Reachability, versions (vs this host), accelerators, free memory/disk, port, clock offset,
    each host checked the way `dslaunch run` would reach it (the `via` column)."""
    from dslaunch.cli.deepspeed_flags import launcher_name
    from dslaunch.launcher import hosts_check
    from dslaunch.launcher.hostfile import HostfileError, default_hostfile, parse_hostfile
    from dslaunch.launcher.runners import RunnerError, get_runner

    path = hostfile or default_hostfile()
    if path is None:
        raise click.UsageError("no hostfile: pass -H HOSTFILE (and /job/hostfile does not exist)")
    try:
        hosts = parse_hostfile(path)
    except HostfileError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"hostfile {path}: {exc.strerror}") from None
    names = list(hosts)
    launcher = launcher_name(launcher, hosts)  # the rule `dslaunch run` follows
    options = {"ssh_port": ssh_port, "ssh_args": ssh_args}
    try:
        runner = get_runner(launcher)
        runner.check_hosts(names)
        transport = runner.probe_transport(options)
        transport(names[0], "true", timeout)  # validates --ssh-args before anything runs
    except RunnerError as exc:
        raise click.UsageError(str(exc)) from None
    if master_port is None and runner.probe_via != "local":
        master_port = 29500
    results = hosts_check.check_hosts(names, transport, python or sys.executable, timeout=timeout,
                                      port=master_port, via=runner.probe_via)
    failed = [r for r in results if r["status"] != "ok"]
    if as_json:
        click.echo(json.dumps({"local": hosts_check.local_versions(), "launcher": launcher,
                               "via": runner.probe_via, "hosts": results, "ok": not failed},
                              indent=2))
    else:
        _table(results, hosts_check, launcher, runner.probe_via)
        if failed:
            click.echo(f"{len(failed)} of {len(results)} host(s) failed: "
                       + ", ".join(f"{r['host']} ({r['status']})" for r in failed), err=True)
    sys.exit(1 if failed else 0)


def _table(results, hc, launcher: str, via: str) -> None:
    from rich.console import Console
    from rich.table import Table

    local = hc.local_versions()
    how = "on this host itself" if via == "local" else f"over {via}"
    t = Table(title=f"hosts (here: python {local['python']}, torch {local['torch']}, "
                    f"dslaunch {local['dslaunch']})\nlauncher {launcher}, as `dslaunch run` "
                    f"picks it: each host checked {how}")
    for col in ("host", "via", "status", "python", "torch", "dslaunch", "gpus", "mem free",
                "disk free", "port", "clock", "reason"):
        t.add_column(col, overflow="fold")
    for r in results:
        ok = r["status"] == "ok"
        port = {True: "free", False: "busy", None: "-"}[r.get("port_free")]
        clock = f"{r['clock_offset']:+.2f} s" if r.get("clock_offset") is not None else "-"
        t.add_row(r["host"], r.get("via") or "-", f"[{'green' if ok else 'red'}]{r['status']}[/]",
                  r.get("python") or "-", r.get("torch") or "-", r.get("dslaunch") or "-", str(r.get("gpus", "-")),
                  hc.human_bytes(r.get("mem_free")), hc.human_bytes(r.get("disk_free")), port, clock,
                  r.get("reason") or r.get("warning") or "")
    Console(width=160).print(t)
