"""``dslaunch autotune SCRIPT --config ds.json [-H hostfile] [ARGS...]``: run short trials of the
script over ZeRO stage x micro-batch x offload and keep the fastest config (``dslaunch/autotune/``).
"""

from __future__ import annotations

import re
import sys

import click

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _parse_bytes(text):
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 80GiB, 512M, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _parse_count(text):
    if text is None:
        return None
    from dslaunch.cli.estimate_memory import _parse_count as parse

    return parse(text)


@click.command("autotune", context_settings={"help_option_names": ["-h", "--help"],
                                             "ignore_unknown_options": True,
                                             "allow_interspersed_args": False})
@click.option("--config", "config_path", required=True, type=click.Path(exists=True,
              dir_okay=False), help="DeepSpeed-style config with an `autotuning` section; lists "
              "(or \"all\") in zero_optimization.stage, train_micro_batch_size_per_gpu and the "
              "offload devices name what is tuned.")
@click.option("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus", "nproc",
              type=click.IntRange(min=1), default=None,
              help="Ranks per host of every trial (default: one per GPU, or 1 on a CPU-only host).")
@click.option("-H", "--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="MPI-style hostfile (HOST slots=N), passed to every trial's dslaunch run.")
@click.option("--num-nodes", "--num_nodes", type=click.IntRange(min=1), default=None,
              help="Use the first N hosts of the hostfile.")
@click.option("--resume", is_flag=True,
              help="Keep the trials already in the results dir (as autotuning.overwrite: false).")
@click.option("--trial-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds after which a trial is stopped and recorded as a timeout.")
@click.option("--memory-per-rank", default=None,
              help="Device memory of one rank for the pruning (e.g. 80GiB; default: the GPU's, "
                   "or host memory / ranks per host).")
@click.option("--params", default=None,
              help="Parameter count for the memory pruning (default: autotuning.model_info."
                   "num_params, else the count the first trial reports).")
@click.option("--seed", type=int, default=0, show_default=True, help="Order of the random tuner.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def autotune(config_path, nproc, hostfile, num_nodes, resume, trial_timeout, memory_per_rank,
             params, seed, script, script_args):
    """Find the fastest ZeRO stage x micro-batch x offload for SCRIPT: each trial is a
    `dslaunch run` job of SCRIPT with a generated config (in autotuning.exps_dir) that stops after
    autotuning.end_profile_step and reports the metric (throughput, latency or flops) measured
    from start_profile_step. Experiments whose model states cannot fit (the memory estimator) are
    pruned; failed, out-of-memory and timed-out trials are recorded, never fatal. The tuner
    (autotuning.tuner_type: gridsearch, random, model_based) picks the trials and stops early
    (tuner_early_stopping, tuner_num_trials).

    Writes to autotuning.results_dir: trials.json (every trial; an interrupted search resumes
    from it with --resume or overwrite: false), ds_config_optimal.json, cmd_optimal.txt and
    summary.txt (the table, also printed).
    """
    from dslaunch.autotune.search import Launch, Options
    from dslaunch.autotune.search import autotune as run_search
    from dslaunch.config import ConfigError
    from dslaunch.launcher.hostfile import HostfileError, parse_hostfile

    hosts, slots = 1, None
    if hostfile:
        try:
            table = parse_hostfile(hostfile)
        except HostfileError as exc:
            raise click.ClickException(str(exc)) from None
        chosen = list(table.items())[:num_nodes] if num_nodes else list(table.items())
        hosts, slots = len(chosen), min(s for _, s in chosen)
    if nproc is None:
        nproc = slots or _local_devices()
    launch = Launch(nproc_per_node=nproc, hosts=hosts, hostfile=hostfile, num_nodes=num_nodes)
    opts = Options(resume=resume, trial_timeout=trial_timeout,
                   memory_per_rank=_parse_bytes(memory_per_rank), num_params=_parse_count(params),
                   seed=seed)
    try:
        summary = run_search(script, list(script_args), config_path, launch, opts)
    except ConfigError as exc:
        raise click.ClickException(f"invalid config {config_path}:\n  "
                                   + "\n  ".join(exc.lines())) from None
    if summary["best"] is None:
        sys.exit(1)


def _local_devices() -> int:
    try:
        import torch

        return max(torch.cuda.device_count(), 1)
    except Exception:
        return 1
