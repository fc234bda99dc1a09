"""Command-line options the multi-host runners add to ``dslaunch run`` (read by ``cli/run.py``).

Their values reach the runner as ``Runner.options`` (keys: the parameter names below).
"""

from __future__ import annotations

import click

OPTIONS = [
    click.option("--ssh-port", "--ssh_port", "ssh_port", type=click.IntRange(1, 65535), default=None,
                 help="ssh/pdsh: port of the hosts' sshd (default: ~/.ssh/config, else 22)."),
    click.option("--ssh-args", "ssh_args", default=None, metavar="ARGS",
                 help="ssh/pdsh: extra ssh client arguments, e.g. \"-i KEY -o ProxyJump=gw\"."),
    click.option("--launcher-args", "--launcher_args", "launcher_args", default=None, metavar="ARGS",
                 help="pdsh/openmpi/mpich/slurm: extra arguments for pdsh, mpirun, mpiexec or srun."),
    click.option("--pdsh-fanout", "pdsh_fanout", type=click.IntRange(min=1), default=None,
                 help="pdsh: at most N concurrent connections (pdsh -f; default: all hosts)."),
    click.option("--no-preflight", "--no_ssh_check", "no_preflight", is_flag=True,
                 help="Skip the check of every host (reachable, same versions, script present)."),
    click.option("--preflight-timeout", "preflight_timeout", type=click.FloatRange(min=1), default=20.0,
                 show_default=True, help="Seconds each host gets to answer the preflight check."),
]
