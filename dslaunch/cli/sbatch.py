"""``dslaunch sbatch [SBATCH OPTIONS] [RUN OPTIONS] SCRIPT [ARGS...]``: write a batch script that runs
``dslaunch run --launcher slurm ...`` on the allocation, and submit it (``--dry-run``: print it).

Everything after the sbatch options is handed to ``dslaunch run`` word for word, each word
shell-quoted in the batch script, so arguments arrive byte-identical. #SBATCH values are checked
(sbatch parses those lines itself, not a shell): no whitespace, quotes or control characters.
The script is given to sbatch on stdin: nothing is left on disk.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click

_SAFE = re.compile(r"[A-Za-z0-9_.,:@%/+=\[\]-]+\Z")


def _dslaunch_cmd() -> list:
    exe = Path(sys.executable).parent / "dslaunch"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    found = shutil.which("dslaunch")
    return [found] if found else [sys.executable, "-c", "from dslaunch.cli import main; main()"]


def render_script(directives: list, cwd: str, run_args: list, dslaunch_cmd: list | None = None) -> str:
    """The batch script text. ``directives``: [(option, value)] for #SBATCH lines (checked)."""
    lines = ["#!/bin/bash"]
    for opt, value in directives:
        value = str(value)
        if not _SAFE.match(value):
            raise click.UsageError(f"--{opt} {value!r}: sbatch reads this from a #SBATCH line; use only "
                                   "letters, digits and _.,:@%/+=[]- (no spaces or quotes)")
        lines.append(f"#SBATCH --{opt}={value}")
    cmd = (dslaunch_cmd or _dslaunch_cmd()) + ["run", "--launcher", "slurm"]
    has_hostfile = any(a in ("-H", "--hostfile") or a.startswith("--hostfile=") for a in run_args)
    lines += [
        "# written by `dslaunch sbatch`: runs dslaunch's agents on the allocated nodes with srun",
        "set -eu",
        f"cd {shlex.quote(cwd)}",
    ]
    if has_hostfile:
        lines.append(f"exec {shlex.join(cmd + list(run_args))}")
    else:
        lines += [
            "# the allocation's nodes, SLURM_NTASKS_PER_NODE slots each",
            'hostfile=$(mktemp "${TMPDIR:-/tmp}/dslaunch-hosts.XXXXXX")',
            "trap 'rm -f \"$hostfile\"' EXIT",
            'scontrol show hostnames "$SLURM_JOB_NODELIST" | while read -r h; do '
            'echo "$h slots=${SLURM_NTASKS_PER_NODE:-1}"; done > "$hostfile"',
            f'{shlex.join(cmd)} -H "$hostfile" {shlex.join(list(run_args))}',
        ]
    return "\n".join(lines) + "\n"


@click.command("sbatch", context_settings={"ignore_unknown_options": True,
                                           "allow_interspersed_args": False,
                                           "help_option_names": ["-h", "--help"]})
@click.option("-N", "--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--ntasks-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks (slots) per node.")
@click.option("-p", "--partition", default=None)
@click.option("-t", "--time", "time_limit", default=None, help="Time limit (sbatch --time).")
@click.option("-J", "--job-name", default="dslaunch", show_default=True)
@click.option("-o", "--output", default=None, help="sbatch --output (default: slurm-%j.out).")
@click.option("-w", "--nodelist", default=None, help="sbatch --nodelist.")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="OPT=VALUE",
              help="Any other sbatch option, as --sbatch-arg mem=8G (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the batch script and submit nothing.")
@click.argument("run_args", nargs=-1, required=True, type=click.UNPROCESSED)
def sbatch(nodes, ntasks_per_node, partition, time_limit, job_name, output, nodelist, sbatch_args,
           dry_run, run_args):
    """Submit `dslaunch run --launcher slurm RUN_ARGS...` as a SLURM batch job."""
    directives = [("job-name", job_name), ("nodes", nodes), ("ntasks-per-node", ntasks_per_node)]
    for opt, value in (("partition", partition), ("time", time_limit), ("output", output),
                       ("nodelist", nodelist)):
        if value is not None:
            directives.append((opt, value))
    for item in sbatch_args:
        opt, sep, value = item.lstrip("-").partition("=")
        if not sep or not re.fullmatch(r"[a-z][a-z0-9-]*", opt):
            raise click.UsageError(f"--sbatch-arg {item!r}: expected OPTION=VALUE, e.g. mem=8G")
        directives.append((opt, value))
    text = render_script(directives, os.getcwd(), list(run_args))
    if dry_run:
        click.echo(text, nl=False)
        return
    if shutil.which("sbatch") is None:
        raise click.ClickException("sbatch is not installed on this host (use --dry-run to see the script)")
    proc = subprocess.run(["sbatch", "--parsable"], input=text.encode(), capture_output=True)
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise click.ClickException(f"sbatch failed: {msg[-1] if msg else f'exit code {proc.returncode}'}")
    job_id = proc.stdout.decode().strip().split(";")[0]
    where = output or "slurm-%j.out"
    click.echo(f"submitted batch job {job_id} (output: {where.replace('%j', job_id)})")
