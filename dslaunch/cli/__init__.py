"""The ``dslaunch`` command. Each sub-command lives in its own module under ``dslaunch/cli/``.

``dslaunch [run options] SCRIPT [ARGS...]`` (and ``python -m dslaunch ...``) is ``dslaunch run``:
DeepSpeed's ``deepspeed --num_gpus 2 train.py ...`` line works with only its first word changed.
A first word that names a sub-command always means that sub-command.

Nothing here imports torch (``dslaunch run`` must start fast): the sub-commands that need it
import it inside their functions.
"""

import click

from dslaunch import __version__
from dslaunch.cli.autotune import autotune
from dslaunch.cli.ckpt import ckpt
from dslaunch.cli.config import config
from dslaunch.cli.estimate_memory import estimate_memory
from dslaunch.cli.hosts import hosts
from dslaunch.cli.nvme_tune import nvme_tune
from dslaunch.cli.report import report
from dslaunch.cli.run import run
from dslaunch.cli.sbatch import sbatch
from dslaunch.cli.top import top


class _Main(click.Group):
    """The group, where a first word that is no sub-command (nor --help/--version) starts ``run``."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help", "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dslaunch")
def main():
    """Launch and train large PyTorch models on one or many hosts (DeepSpeed-compatible).

    `dslaunch [RUN OPTIONS] SCRIPT [ARGS]...` (no sub-command) is `dslaunch run`, so a `deepspeed`
    command line runs with its first word changed (e.g. `python -m dslaunch --num_gpus 2 train.py`).
    """


for _command in (run, config, hosts, report, ckpt, sbatch, nvme_tune, estimate_memory, top,
                 autotune):
    main.add_command(_command)
