"""Runner registry: ``--launcher NAME`` -> the class that implements it.

Each module under ``runners/`` defines one ``runners.base.Runner`` subclass as ``RUNNER``. They
are all imported here (together about 15 ms, nothing heavy): a reader or a tool follows a name to
its class in one step. Adding a runner is one line here plus its module.
"""

from __future__ import annotations

from dslaunch.launcher.runners import local, mpich, openmpi, pdsh, slurm, ssh
from dslaunch.launcher.runners.base import Runner, RunnerError

RUNNERS = {
    "local": local.RUNNER,
    "ssh": ssh.RUNNER,
    "pdsh": pdsh.RUNNER,
    "openmpi": openmpi.RUNNER,
    "mpich": mpich.RUNNER,
    "slurm": slurm.RUNNER,
}


def get_runner(name: str) -> type:
    """The runner class for ``name``; RunnerError (one line) if unknown."""
    if name not in RUNNERS:
        raise RunnerError(f"unknown launcher {name!r}; choose one of {', '.join(RUNNERS)}")
    return RUNNERS[name]


__all__ = ["RUNNERS", "Runner", "RunnerError", "get_runner"]
