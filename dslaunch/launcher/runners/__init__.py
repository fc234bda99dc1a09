"""Runner registry: ``--launcher NAME`` -> the module that implements it.

Each module exposes ``RUNNER`` (a ``runners.base.Runner`` subclass). Modules are imported only
when chosen, so ``dslaunch run`` never pays for a runner it does not use. Adding a runner is one
line here plus its module; a name whose module does not exist yet is reported as unavailable.
"""

from __future__ import annotations

import importlib

from dslaunch.launcher.runners.base import Runner, RunnerError

RUNNERS = {
    "local": "dslaunch.launcher.runners.local",
    "ssh": "dslaunch.launcher.runners.ssh",
    "pdsh": "dslaunch.launcher.runners.pdsh",
    "openmpi": "dslaunch.launcher.runners.openmpi",
    "mpich": "dslaunch.launcher.runners.mpich",
    "slurm": "dslaunch.launcher.runners.slurm",
}


def get_runner(name: str) -> type:
    """The runner class for ``name``; RunnerError (one line) if unknown or not built."""
    if name not in RUNNERS:
        raise RunnerError(f"unknown launcher {name!r}; choose one of {', '.join(RUNNERS)}")
    try:
        module = importlib.import_module(RUNNERS[name])
    except ModuleNotFoundError as exc:
        if exc.name != RUNNERS[name]:
            raise
        raise RunnerError(f"launcher {name!r} is not available in this version of dslaunch") from None
    return module.RUNNER


__all__ = ["RUNNERS", "Runner", "RunnerError", "get_runner"]
