"""The ``dslaunch`` command. Each sub-command lives in its own module under ``dslaunch/cli/``.

Nothing here imports torch (``dslaunch run`` must start fast): the sub-commands that need it
import it inside their functions.
"""

import click

from dslaunch import __version__
from dslaunch.cli.ckpt import ckpt
from dslaunch.cli.config import config
from dslaunch.cli.estimate_memory import estimate_memory
from dslaunch.cli.hosts import hosts
from dslaunch.cli.nvme_tune import nvme_tune
from dslaunch.cli.report import report
from dslaunch.cli.run import run
from dslaunch.cli.sbatch import sbatch


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dslaunch")
def main():
    """Launch and train large PyTorch models on one or many hosts (DeepSpeed-compatible)."""


for _command in (run, config, hosts, report, ckpt, sbatch, nvme_tune, estimate_memory):
    main.add_command(_command)
