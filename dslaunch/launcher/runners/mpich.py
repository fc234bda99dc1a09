"""``--launcher mpich``: see ``runners/mpi.py``."""

from dslaunch.launcher.runners.mpi import MPICHRunner

RUNNER = MPICHRunner
