"""``--launcher openmpi``: see ``runners/mpi.py``."""

from dslaunch.launcher.runners.mpi import OpenMPIRunner

RUNNER = OpenMPIRunner
