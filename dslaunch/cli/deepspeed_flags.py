"""The options of DeepSpeed's ``deepspeed`` launcher that ``dslaunch run`` accepts as typed, where
they are not simply other spellings of an option ``run`` already has (those are aliases there:
``--num_gpus``, ``--num_nodes``, ``--master_addr``, ``--master_port``, ``--launcher_args``,
``--ssh_port``, ``--no_ssh_check``, ``--enable_each_rank_log``, ``--module``, ``-H/-i/-e``).

Also here: which launcher runs a plan when ``--launcher`` is not given (DeepSpeed's rule: a
hostfile naming other hosts goes through pdsh when it is installed, else OpenSSH), and DeepSpeed's
launcher names (upper or lower case, as DeepSpeed takes them).
"""

from __future__ import annotations

import hashlib
import json
import shutil

import click

from dslaunch.launcher.plan import LOCAL_HOSTS

# DeepSpeed's default MASTER_PORT: with --no_ssh every node's launcher must name the same port
# without talking to the others, so a free port picked here would not do.
NO_SSH_PORT = 29500
# DeepSpeed's launcher names we have no runner for, and what to use instead.
UNSUPPORTED = {"mvapich": "mpich (MVAPICH2 ships the same hydra mpiexec)",
               "impi": "mpich (Intel MPI's mpiexec is hydra too) or openmpi"}

OPTIONS = [
    click.option("--no_ssh", "--no-ssh", "no_ssh", is_flag=True,
                 help="Start only this node's ranks (--node_rank), reaching no other host: run the "
                      "same command on every node (e.g. a Kubernetes indexed job). Needs the same "
                      "hostfile and --master_addr everywhere; MASTER_PORT defaults to 29500."),
    click.option("--node_rank", "--node-rank", "node_rank", type=click.IntRange(min=0), default=None,
                 help="With --no_ssh: which node of the hostfile this is (0-based, hostfile order)."),
    click.option("--no_local_rank", "--no-local-rank", "no_local_rank", is_flag=True,
                 help="With --as-deepspeed: leave out the --local_rank=N argument it adds (as "
                      "DeepSpeed's flag does); without it dslaunch adds none anyway (LOCAL_RANK is in "
                      "the environment, as with torchrun)."),
    click.option("--bind_cores_to_rank", "--bind-cores-to-rank", "bind_cores", is_flag=True,
                 help="Pin each rank to an equal block of its host's cores (OMP_NUM_THREADS = the "
                      "block's size unless --omp-threads)."),
    click.option("--bind_core_list", "--bind-core-list", "bind_core_list", default=None,
                 metavar="LIST", help="With --bind_cores_to_rank: the cores to share out, e.g. "
                                      "0-7,16-23 (default: every core the launcher may use)."),
    click.option("--run-id", "--run_id", "run_id", default=None,
                 help="TORCHELASTIC_RUN_ID of every rank (default: a new id per job; with --no_ssh "
                      "one derived from what every node is given, so all nodes agree)."),
]


def deepspeed_options(func):
    for option in reversed(OPTIONS):
        func = option(func)
    return func


def launcher_name(given: str | None, selection: dict) -> str:
    """The runner for this plan: ``given`` (case-insensitive, DeepSpeed's names accepted), else
    ``local`` when every host is this one, else pdsh when installed, else ssh."""
    if given:
        name = given.lower()
        if name in UNSUPPORTED:
            raise click.UsageError(f"--launcher {given}: not supported by dslaunch; use {UNSUPPORTED[name]}")
        return name
    if all(h in LOCAL_HOSTS for h in selection):
        return "local"
    return "pdsh" if shutil.which("pdsh") else "ssh"


def no_ssh_run_id(selection: dict, master_addr: str | None, master_port: int) -> str:
    """A run id every node computes alike from what they all must be given."""
    text = json.dumps([list(selection.items()), master_addr, master_port], sort_keys=True)
    return "dslaunch-" + hashlib.sha1(text.encode()).hexdigest()[:16]
