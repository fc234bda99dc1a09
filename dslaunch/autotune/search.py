"""The search loop: build the space, prune it, run trials one at a time as the tuner picks them,
record each at once, and write the best config and the table at the end.

Resuming: with ``autotuning.overwrite: false`` (or ``dslaunch autotune --resume``) the trials in
``<results_dir>/trials.json`` whose experiment and config are unchanged count as done and are not
run again; the trial that was running when the search was interrupted runs again. With
``overwrite: true`` (DeepSpeed's default) earlier results are ignored and replaced.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field

from dslaunch.config.sections import to_dict

from . import results as res
from .settings import read_tuning_input
from .space import build_space, memory_pruned
from .trial import config_hash, run_trial, script_args, trial_config
from .tuners import best_record, make_tuner, metric_value


@dataclass
class Launch:
    """How each trial job is launched (``dslaunch run`` options)."""

    nproc_per_node: int
    hosts: int = 1
    hostfile: str | None = None
    num_nodes: int | None = None
    python: str = sys.executable

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.hosts

    def run_command(self, config_path: str, script: str, args: list) -> list:
        cmd = [self.python, "-m", "dslaunch", "run", "--nproc-per-node", str(self.nproc_per_node)]
        if self.hostfile:
            cmd += ["-H", self.hostfile]
        if self.num_nodes:
            cmd += ["--num-nodes", str(self.num_nodes)]
        return cmd + ["--config", config_path, script, *args]


@dataclass
class Options:
    resume: bool = False
    trial_timeout: float = 600.0
    memory_per_rank: int | None = None  # device bytes per rank (None: measured)
    num_params: int | None = None  # None: autotuning.model_info.num_params, else the first trial
    seed: int = 0
    extra: dict = field(default_factory=dict)


def _memory(launch: Launch, opts: Options) -> tuple:
    """(device bytes per rank, host bytes) the pruning compares model states with."""
    import psutil

    host = psutil.virtual_memory().total
    if opts.memory_per_rank is not None:
        return opts.memory_per_rank, host
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory, host
    except Exception:  # no usable accelerator: host memory is the device memory
        pass
    return host // launch.nproc_per_node, host


def autotune(script: str, args: list, config_path: str, launch: Launch, opts: Options,
             console=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if console is None:  # a log file or a pipe: wide enough for the table, no animation
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 200))
    tin = read_tuning_input(config_path, launch.world_size)
    section = tin.section
    section_values = {k: v for k, v in to_dict(section).items() if v is not None}
    section_values.pop("metric_path", None)
    metric = section.metric
    dp = launch.world_size
    results_dir = os.path.abspath(section.results_dir)
    exps_dir = os.path.abspath(section.exps_dir)
    os.makedirs(results_dir, exist_ok=True)
    os.makedirs(exps_dir, exist_ok=True)

    experiments, pruned = build_space(tin, dp)
    num_params = opts.num_params
    model_info = section.model_info or {}
    if num_params is None and model_info.get("num_params"):
        num_params = int(model_info["num_params"])
    device_bytes, host_bytes = _memory(launch, opts)

    def prune_memory(exps):
        keep, out = memory_pruned(exps, num_params, launch.world_size, launch.nproc_per_node,
                                  tin.precision, tin.optimizer, device_bytes, host_bytes)
        pruned.extend(out)
        return keep

    if num_params is not None:
        experiments = prune_memory(experiments)

    def plan(exp):
        cfg_path = os.path.join(exps_dir, f"{exp.name}.json")
        metric_path = os.path.join(exps_dir, exp.name, "metric.json")
        cfg = trial_config(tin.base, exp, section_values, metric_path)
        return cfg_path, metric_path, cfg

    # earlier trials: reused when resuming and their experiment and config are unchanged
    records: dict = {}
    if opts.resume or not section.overwrite:
        wanted = {e.name: config_hash(plan(e)[2]) for e in experiments}
        for rec in res.load_trials(results_dir):
            if wanted.get(rec.get("name")) == rec.get("config_hash"):
                records[rec["name"]] = rec
        if records:
            console.print(f"[bold]resuming[/]: {len(records)} trial(s) already done in "
                          f"{results_dir}")
    header = {"script": script, "args": list(args), "config": os.path.abspath(config_path),
              "metric": metric, "tuner_type": section.tuner_type, "world_size": dp,
              "gradient_accumulation_steps": tin.gas}
    res.save_trials(results_dir, header, list(records.values()))

    tuner = make_tuner(section.tuner_type, experiments, section, opts.seed)
    console.print(f"autotuning {script}: {len(experiments)} experiment(s) "
                  f"({len(pruned)} pruned), tuner {section.tuner_type}, metric {metric}, "
                  f"{dp} rank(s), steps {section.start_profile_step}..{section.end_profile_step}")
    for exp, reason in pruned:
        console.print(f"  pruned {exp.name}: {reason}")

    stop_reason = None
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("trials", total=len(experiments), completed=len(records))
        while True:
            exp, stop_reason = tuner.next(records)
            if exp is None:
                break
            cfg_path, metric_path, cfg = plan(exp)
            os.makedirs(os.path.dirname(metric_path), exist_ok=True)
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent=2)
            command = launch.run_command(
                cfg_path, script, script_args(args, cfg_path, cfg, section.arg_mappings))
            progress.update(task, description=f"trial {exp.name}")
            outcome = run_trial(command, os.path.join(exps_dir, exp.name, "job.log"),
                                metric_path, opts.trial_timeout)
            rec = dict(exp.to_dict(), name=exp.name, group=list(exp.group), index=len(records),
                       config=cfg_path, log=os.path.join(exps_dir, exp.name, "job.log"),
                       config_hash=config_hash(cfg), finished=time.time(), **outcome)
            records[exp.name] = rec
            res.save_trials(results_dir, header, list(records.values()))
            value = metric_value(rec, metric)
            shown = f"{metric} {value:,.4g}" if value is not None else rec["error"] or ""
            console.print(f"  {exp.name}: [bold]{rec['status']}[/] {shown} "
                          f"({rec['seconds']:.1f} s)")
            if num_params is None and rec["status"] == "ok":
                num_params = rec["metrics"].get("num_params")
                if num_params:  # now the memory estimator can prune what is left
                    before = set(e.name for e in experiments)
                    kept = [e for e in experiments if e.name in records]
                    kept += prune_memory([e for e in experiments if e.name not in records])
                    experiments = [e for e in experiments if e.name in {k.name for k in kept}]
                    tuner.experiments = [e for e in tuner.experiments
                                         if e.name in {k.name for k in kept}]
                    for e in before - {k.name for k in kept}:
                        console.print(f"  pruned {e}: model states do not fit")
                    progress.update(task, total=len(experiments))
            progress.update(task, completed=len(records))
        progress.update(task, description="done")

    best = best_record(records, metric)
    not_run = [(e, "pruned", r) for e, r in pruned]
    not_run += [(e, "skipped", r) for e, r in tuner.skipped(records)]
    summary = {"stop_reason": stop_reason, "best": best["name"] if best else None,
               "trials_run": len(records),
               "trial_seconds_total": round(sum(r.get("seconds", 0) for r in records.values()), 3),
               "not_run": [dict(e.to_dict(), name=e.name, status=s, reason=r)
                           for e, s, r in not_run]}
    if best is not None:
        with open(best["config"]) as f:
            best_cfg = json.load(f)
        best_cfg["autotuning"].pop("metric_path", None)
        best_cfg["autotuning"]["enabled"] = False  # a plain run of it trains; it does not tune
        cfg_out = os.path.join(results_dir, "ds_config_optimal.json")
        best_args = script_args(args, cfg_out, best_cfg, section.arg_mappings)
        command = ["dslaunch", "run"] + launch.run_command(cfg_out, script, best_args)[4:]
        summary["ds_config_optimal"], summary["cmd_optimal"] = res.write_best(
            results_dir, best_cfg, [shlex.quote(c) for c in command])
        summary["best_metrics"] = best["metrics"]
    res.save_trials(results_dir, header, list(records.values()), summary)
    tbl = res.table(list(records.values()), not_run, metric, summary["best"], dp, tin.gas)
    console.print(tbl)
    with open(os.path.join(results_dir, "summary.txt"), "w") as f:
        f.write(res.table_text(tbl))
        f.write(f"\nstopped: {stop_reason}\n")
        if best is not None:
            f.write(f"best: {best['name']} ({metric} {metric_value(best, metric):,.6g})\n")
    console.print(f"stopped: {stop_reason}")
    if best is not None:
        console.print(f"best: [bold]{best['name']}[/] ({metric} "
                      f"{metric_value(best, metric):,.6g}) -> {summary['ds_config_optimal']}")
    else:
        console.print("[bold red]no trial succeeded[/]; see the job logs under " + exps_dir)
    summary["results_dir"] = results_dir
    return summary
