"""The ``dslaunch`` command. Each sub-command lives in its own module under ``dslaunch/cli/``.

Sub-command modules are imported only when they exist, so the group stays usable while parts of the
product are being built, and nothing here imports torch (``dslaunch run`` must start fast).
"""

import importlib

import click

from dslaunch import __version__

# (module under dslaunch.cli, attribute): each attribute is a click command or group.
_COMMANDS = [
    ("run", "run"),
    ("config", "config"),
    ("hosts", "hosts"),
    ("report", "report"),
    ("ckpt", "ckpt"),
    ("sbatch", "sbatch"),
    ("nvme_tune", "nvme_tune"),
    ("estimate_memory", "estimate_memory"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dslaunch")
def main():
    """Launch and train large PyTorch models on one or many hosts (DeepSpeed-compatible)."""


for _module, _attr in _COMMANDS:
    try:
        _mod = importlib.import_module(f"dslaunch.cli.{_module}")
    except ModuleNotFoundError as exc:  # that sub-command is not built yet
        if exc.name != f"dslaunch.cli.{_module}":
            raise
        continue
    main.add_command(getattr(_mod, _attr))
