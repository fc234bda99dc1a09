"""Runner registry: ``--launcher NAME`` -> the class that implements it.

Each runner is a ``runners.base.Runner`` subclass in its own module (``mpi.py`` holds Open MPI's
and MPICH's, which differ in a few flags). All are imported here (together about 15 ms, nothing
heavy), so a reader or a tool follows a name to its class in one step. Adding a runner is one line
here plus its module.
"""

from __future__ import annotations

from dslaunch.launcher.runners.base import Runner, RunnerError
from dslaunch.launcher.runners.local import LocalRunner
from dslaunch.launcher.runners.mpi import MPICHRunner, OpenMPIRunner
from dslaunch.launcher.runners.pdsh import PdshRunner
from dslaunch.launcher.runners.slurm import SlurmRunner
from dslaunch.launcher.runners.ssh import SSHRunner

RUNNERS = {
    "local": LocalRunner,
    "ssh": SSHRunner,
    "pdsh": PdshRunner,
    "openmpi": OpenMPIRunner,
    "mpich": MPICHRunner,
    "slurm": SlurmRunner,
}


def get_runner(name: str) -> type:
    """The runner class for ``name``; RunnerError (one line) if unknown."""
    if name not in RUNNERS:
        raise RunnerError(f"unknown launcher {name!r}; choose one of {', '.join(RUNNERS)}")
    return RUNNERS[name]


__all__ = ["RUNNERS", "Runner", "RunnerError", "get_runner"]
