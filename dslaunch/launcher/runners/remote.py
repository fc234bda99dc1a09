"""What every multi-host runner shares: the remote agent command line and the ssh client argv.

The remote command is ONE shell word list built with shlex.quote: only our own words (interpreter
path, module name, base64 plan, node rank) ever reach the remote shell. The user's program
arguments and environment are inside the base64 plan, so no value of theirs is parsed by a shell.
"""

from __future__ import annotations

import shlex

from dslaunch.launcher.runners.base import RunnerError

# ssh client options every connection gets: never prompt (a password prompt would hang the job),
# no tty (stdin is our command channel), no X11/agent forwarding.
SSH_BASE = ["-T", "-x", "-a", "-o", "BatchMode=yes"]
# Keepalives: a connection to a host that went silent (no FIN, no RST) ends after ~9 s instead of
# hanging for the TCP timeout (minutes). The agents' heartbeats name the lost host first; this
# makes sure an ssh client that mpirun/pdsh started (and that we cannot always kill: Open MPI puts
# them in their own process groups) lets go of the job's output pipe.
SSH_KEEPALIVE = ["-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3"]


def user_words(text: str | None, what: str) -> list:
    """Split a user's ``--ssh-args``/``--launcher-args`` into argv words (no shell involved)."""
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise RunnerError(f"{what}: {exc}") from None


def ssh_argv(host: str, options: dict, connect_timeout: float | None = None) -> list:
    """``ssh [opts] HOST`` (the remote command is appended by the caller after ``--``)."""
    argv = ["ssh", *SSH_BASE, *SSH_KEEPALIVE]
    if connect_timeout:
        argv += ["-o", f"ConnectTimeout={int(max(1, connect_timeout))}"]
    if options.get("ssh_port"):
        argv += ["-p", str(options["ssh_port"])]
    argv += user_words(options.get("ssh_args"), "--ssh-args")
    return argv + [host]


def agent_words(argv: list) -> str:
    """The agent argv as a remote shell command (each word quoted; ``exec``: no extra shell)."""
    return "exec " + shlex.join(argv)


def terminate_then_kill(agent, after: float = 3.0) -> None:
    """Stop a fan-out process (mpirun, srun) that carries several agents: close its stdin, SIGTERM
    its process group (mpirun and srun pass SIGTERM on to every agent, which then stops its ranks
    gracefully), and SIGKILL the group only if it is still there ``after`` seconds later. SIGKILL
    first would make the MPI/SLURM daemons kill the agents before they can stop their ranks."""
    import os
    import signal
    import subprocess
    import threading

    try:
        agent.proc.stdin.close()
    except (OSError, ValueError):
        pass
    try:
        os.killpg(agent.proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return

    def escalate():
        try:
            agent.proc.wait(after)
        except subprocess.TimeoutExpired:
            pass
        try:  # the group may outlive its leader (e.g. an ssh child stuck on a dead host)
            os.killpg(agent.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    threading.Thread(target=escalate, daemon=True).start()
