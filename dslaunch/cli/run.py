"""``dslaunch run [options] SCRIPT [ARGS...]``: resolve the plan, then hand it to a runner.

Everything after SCRIPT goes to the script untouched (even ``--config`` or ``--help``): it is
passed as data, never through a shell. Bad input fails here, before any process starts,
including a DeepSpeed config named in the script's arguments (``--deepspeed_config FILE``, or
``--config FILE`` when FILE is a DeepSpeed config: ``_script_configs``, docs/launcher.md), checked
by the same ``_config`` as ``--config``.

Defaults worth knowing:
- no hostfile (and no ``/job/hostfile``): this host, with ``--nproc-per-node`` ranks; without it,
  one rank per GPU where the host has GPUs, else 1 rank (on CPU, more ranks is a choice, not a
  default: each rank's threads compete for the same cores);
- ``--launcher slurm`` without a hostfile: the allocation's nodes, ``SLURM_NTASKS_PER_NODE`` slots
  each (inside ``salloc`` / ``sbatch``);
- no ``--launcher``: local when every host is this one, else pdsh when installed, else ssh
  (DeepSpeed's choice); DeepSpeed's other flags: ``cli/deepspeed_flags.py``, docs/launcher.md;
- ``MASTER_ADDR``: 127.0.0.1 for a local run, else the plan's first host; ``MASTER_PORT``: a
  port free on this host (29500 with ``--no_ssh``: every node must agree without talking);
- ``OMP_NUM_THREADS``: cores // local ranks (min 1) unless it is already set or ``--omp-threads``;
- ``--local_rank`` is not added to the script's argv (as torchrun); LOCAL_RANK is in its env.
  ``--as-deepspeed`` adds it (``--local_rank=N``, as DeepSpeed's launcher) and sets
  ``DSLAUNCH_AS_DEEPSPEED=1`` on every rank: ``import deepspeed`` then gives dslaunch
  (docs/frameworks.md).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from dslaunch.cli.deepspeed_flags import NO_SSH_PORT, deepspeed_options, launcher_name, no_ssh_run_id
from dslaunch.config import ConfigError, load_config, looks_like_deepspeed, resolve_config
from dslaunch.launcher.plan import LOCAL_HOSTS, WorldPlan, build_plan
from dslaunch.launcher.runners import RUNNERS, RunnerError, get_runner
from dslaunch.launcher.runners.options import OPTIONS

CONTEXT = {
    "ignore_unknown_options": True,  # an unknown option after SCRIPT belongs to the script
    "allow_interspersed_args": False,  # everything after SCRIPT is the script's
    "help_option_names": ["-h", "--help"],
}


def _extra_options(func):
    """Options a multi-host runner contributes (``runners/options.py: OPTIONS``, a list of click
    option decorators) without editing this file; their values reach the runner as ``options``."""
    for option in reversed(OPTIONS):
        func = option(func)
    return func


def _gpu_count() -> int:
    from dslaunch.launcher.agent import detect_gpus

    if not detect_gpus():
        return 0
    try:
        return len([e for e in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        import subprocess

        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _hosts(hostfile, nproc_per_node, launcher="local", spares: set | None = None) -> tuple:
    """(host -> slot count, where they came from); hostfile spares are added to ``spares``."""
    from dslaunch.launcher.hostfile import HostfileError, default_hostfile, parse_hostfile

    path = hostfile or default_hostfile()
    if path is None and launcher == "slurm":
        # inside salloc/sbatch the allocation is the host list, as srun itself would use it
        from dslaunch.launcher.runners.slurm import allocation_hosts
        try:
            return allocation_hosts(), "the SLURM allocation"
        except RunnerError as exc:
            raise click.ClickException(f"--launcher slurm without -H: {exc}; run it inside "
                                       "salloc/sbatch, or submit with `dslaunch sbatch`") from None
    if path is not None:
        try:
            return parse_hostfile(path, spares), str(path)
        except HostfileError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(f"hostfile {path}: {exc.strerror}") from None
    slots = max(nproc_per_node or 0, _gpu_count(), 1)
    return {"localhost": slots}, "this host"


def _readable(path, label: str) -> None:
    """One line and exit 1 when ``path`` cannot be read as a file (missing, a directory, no
    permission): before any rank starts, never a traceback from each rank."""
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise click.ClickException(f"{label}: no such file; no rank was started") from None
    except OSError as exc:
        raise click.ClickException(f"{label}: cannot read it ({exc.strerror or exc}); no rank was "
                                   "started") from None


def _config(path: str, world_size: int, label: str | None = None) -> str:
    """The config as written, validated for this world size (every problem listed at once), as
    JSON for DSLAUNCH_CONFIG. The ranks resolve it themselves, once, with their real
    data-parallel size: shipping our resolution would pass off what we inferred for an assumed
    layout (data parallel = world size / written model-parallel sizes) as the user's own.
    ``label``: how the file was named (``--config FILE``, or a config in the script's arguments)."""
    _readable(path, label or f"--config {path}")
    try:
        written = load_config(path)
        resolve_config(written, world_size=world_size, origin=path, autos="describe")
    except ConfigError as exc:
        lines = exc.lines()
        if any(p.startswith(("train_batch_size", "train_micro_batch_size_per_gpu",
                             "gradient_accumulation_steps")) for p in exc.problems):
            lines.append("(the data-parallel size here is the world size divided by the written "
                         "pipeline.stages and tensor_parallel.autotp_size: a pipeline or tensor-"
                         "parallel script should write them)")
        raise click.ClickException(
            f"invalid config {path} ({len(exc.problems)} problem(s)); no rank was started:\n  "
            + "\n  ".join(lines)) from None
    return json.dumps(written, separators=(",", ":"))


# The script's own arguments that name a DeepSpeed config (what dslaunch.add_config_arguments
# declares, and DeepSpeed's examples pass): ``--deepspeed_config`` (and the old
# ``--deepscale_config``) always do; ``--config`` may be the script's model or trainer config, so
# its file is checked only when it reads as a DeepSpeed config (docs/launcher.md).
DEEPSPEED_CONFIG_FLAGS = ("--deepspeed_config", "--deepscale_config")
SCRIPT_CONFIG_FLAGS = (*DEEPSPEED_CONFIG_FLAGS, "--config")
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def _config_args(script_args) -> list:
    """``(flag, value)`` for each config flag in the script's arguments, ``--flag FILE`` or
    ``--flag=FILE``, in order; a bare ``--`` ends the options (argparse's rule)."""
    found, i = [], 0
    while i < len(script_args):
        word = script_args[i]
        if word == "--":
            break
        flag, eq, value = word.partition("=")
        if flag in SCRIPT_CONFIG_FLAGS:
            if not eq:
                i += 1
                value = script_args[i] if i < len(script_args) else ""
            if value and not value.startswith("-"):
                found.append((flag, value))
            elif not eq:
                continue  # the next word is an option of its own: look at it too
        i += 1
    return found


def _script_configs(script_args, cwd: Path, world_size: int, files_here: bool) -> list:
    """``(flag, value, resolved path, config JSON)`` for each DeepSpeed config the script's
    arguments name, each validated exactly as ``--config`` is (``_config``) before any rank
    starts; the script still gets its arguments untouched. Paths are relative to the ranks'
    directory. ``files_here``: the ranks run on this host, so a file that should be there and is
    not is an error (multi-host: it may exist only on the hosts, and is left to them)."""
    out = []
    for flag, value in _config_args(script_args):
        path = Path(value) if Path(value).is_absolute() else cwd / value
        shown = value if path == Path(value).absolute() else f"{value} (in {cwd})"
        label = f"the script's {flag} {shown}"
        deepspeed_flag = flag in DEEPSPEED_CONFIG_FLAGS
        if not path.exists() and not files_here:
            continue
        if not deepspeed_flag:
            if Path(value).suffix.lower() not in CONFIG_SUFFIXES and not path.is_file():
                continue  # `--config small`: a name the script knows, not a file of ours
            _readable(path, label)
            try:
                data = load_config(str(path))
            except ConfigError:
                continue  # not JSON/YAML we read (JSON5, comments, ...): the script's own format
            if not looks_like_deepspeed(data):
                continue  # the script's model or trainer config
        out.append((flag, value, str(path), _config(str(path), world_size, label)))
    return out


HANG_TIMEOUT = 300.0


def _hang_timeout(flag: float | None, config_json: str | None) -> float:
    """--hang-timeout, else the config's ``fault_tolerance.hang_timeout`` (validated already),
    else HANG_TIMEOUT."""
    if flag is not None:
        return flag
    section = (json.loads(config_json).get("fault_tolerance") or {}) if config_json else {}
    value = section.get("hang_timeout")
    return HANG_TIMEOUT if value is None else float(value)


def _recover(flag: str | None, config_json: str | None) -> str:
    """--recover, else the config's ``fault_tolerance.recover``, else "restart"."""
    if flag is not None:
        return flag
    section = (json.loads(config_json).get("fault_tolerance") or {}) if config_json else {}
    return section.get("recover") or "restart"


def _env(env_items: tuple, cwd: Path) -> tuple:
    from dslaunch.launcher.environment import EnvError, collect_env

    try:
        collected = collect_env(list(env_items), cwd, Path.home())
    except EnvError as exc:
        raise click.ClickException(str(exc)) from None
    return ({k: v for k, (v, _) in collected.items()}, {k: src for k, (_, src) in collected.items()})


def _faults(specs: tuple, hosts: list, world_size: int) -> list:
    """The --inject specs, checked against the job before anything starts."""
    if not specs:
        return []
    from dslaunch.launcher.inject import InjectError, parse_specs

    try:
        return parse_specs(specs, hosts, world_size)
    except InjectError as exc:
        raise click.UsageError(str(exc)) from None


def _elastic(selection: dict, spares: dict, nnodes, min_nodes, max_nodes, no_ssh) -> tuple:
    """(first selection, spares, ElasticPolicy) from ``--nnodes MIN:MAX`` or DeepSpeed's
    ``--min_elastic_nodes/--max_elastic_nodes``; hosts beyond MAX wait as spares."""
    from dslaunch.launcher.elastic import ElasticPolicy, ElasticStop, parse_nnodes

    if nnodes is not None and (min_nodes is not None or max_nodes is not None):
        raise click.UsageError("--nnodes and --min_elastic_nodes/--max_elastic_nodes say the same "
                               "thing: give one of them")
    if nnodes is not None:
        try:
            lo, hi = parse_nnodes(nnodes)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    else:
        count = len(selection)
        lo, hi = min_nodes or min(count, max_nodes or count), max_nodes or count
        if lo > hi:
            raise click.UsageError(f"--min_elastic_nodes {lo} is more than --max_elastic_nodes {hi}")
    if no_ssh and (lo, hi) != (len(selection), len(selection)):
        raise click.UsageError("--nnodes MIN:MAX with --no_ssh: each node's launcher starts only "
                               "its own ranks and cannot re-plan the job")
    try:
        policy = ElasticPolicy.start(selection, spares, lo, hi)
    except ElasticStop as stop:
        raise click.ClickException(stop.reason) from None
    return policy.selection(), {h: policy.hosts[h] for h in policy.spares}, policy


def _print_summary(plan: WorldPlan) -> None:
    click.echo(f"launcher: {plan.launcher}   world size: {plan.world_size}   "
               f"master: {plan.master_addr}:{plan.master_port}   run id: {plan.run_id}")
    for n in plan.nodes:
        click.echo(f"  node {n['node_rank']} {n['host']}: slots {n['slots']} -> ranks {n['ranks']}")
    for host, slots in plan.spares.items():
        click.echo(f"  spare {host}: slots {slots} (used by a restart when a host is lost)")
    if plan.nnodes and plan.nnodes[0] != plan.nnodes[1]:
        click.echo(f"elastic: {plan.nnodes[0]} to {plan.nnodes[1]} hosts (--nnodes)")
    click.echo(f"each rank runs: {plan.rank_command()}  (cwd {plan.cwd})")
    if plan.config_path:
        click.echo(f"config: {plan.config_path} (validated, passed as written in DSLAUNCH_CONFIG)")
    omp = plan.omp_threads if plan.omp_threads is not None else "cores // local ranks, unless set"
    click.echo(f"OMP_NUM_THREADS: {omp}")
    from dslaunch.launcher.environment import is_secret

    click.echo(f"environment propagated ({len(plan.env)}):")
    for k in sorted(plan.env):
        shown = "*** (hidden; --json shows it)" if is_secret(k) else shlex.quote(plan.env[k])
        click.echo(f"  {k}={shown}   [{plan.env_sources.get(k, '?')}]")
    click.echo("agent commands:")
    for c in plan.commands:
        click.echo(f"  {c if len(c) < 300 else c[:297] + '...'}")


@click.command("run", context_settings=CONTEXT)
@click.option("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus", "--num_accelerators",
              "nproc_per_node", type=int, default=None,
              help="Ranks per host (default: one per GPU, or 1 on a CPU-only host).")
@click.option("--num-nodes", "--num_nodes", "num_nodes", type=int, default=None,
              help="Use the first N hosts of the hostfile.")
@click.option("-H", "--hostfile", type=click.Path(dir_okay=False), default=None,
              help="MPI-style hostfile (HOST slots=N); default /job/hostfile if present, else this host.")
@click.option("-i", "--include", default=None, help="NODE_SPEC[@NODE_SPEC...] to use, e.g. host1:0,2@host2.")
@click.option("-e", "--exclude", default=None, help="NODE_SPEC[@NODE_SPEC...] to leave out.")
@click.option("--master-addr", "--master_addr", "master_addr", default=None,
              help="Rendezvous address (default 127.0.0.1 locally, else the first host).")
@click.option("--master-port", "--master_port", "master_port", type=click.IntRange(1, 65535), default=None,
              help="Rendezvous port (default: a free port).")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="DeepSpeed-style JSON/YAML config: validated before any rank starts, passed in "
                   "DSLAUNCH_CONFIG. A DeepSpeed config in the script's own arguments "
                   "(--deepspeed_config FILE, or --config FILE) is validated the same way "
                   "(docs/launcher.md).")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="Set a variable on every rank (repeatable); the value is passed literally.")
@click.option("--log-dir", "--enable_each_rank_log", "log_dir", type=click.Path(file_okay=False), default=None,
              help="Also write each rank's output to DIR/rank_N.log, and the live job view to "
                   "DIR/status.json (what `dslaunch top --log-dir DIR` reads).")
@click.option("--launcher", default=None,
              help=f"How agents are started: {', '.join(RUNNERS)} (any case). Default: local when "
                   "every host is this one, else pdsh when installed, else ssh.")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a module name, run as python -m.")
@click.option("--omp-threads", type=click.IntRange(min=1), default=None,
              help="OMP_NUM_THREADS per rank (default: cores // local ranks unless already set).")
@click.option("--max-restarts", "--max_restarts", "max_restarts", type=click.IntRange(min=0), default=0,
              show_default=True,
              help="Restart the whole job after a failure up to N times (budget across the job), "
                   "without lost hosts (spares and hosts that answer again take their place). Exit "
                   "75: too few hosts left; 3: crash loop (3 restarts without progress).")
@click.option("--recover", type=click.Choice(["restart", "in-process"]), default=None,
              help="What a failed or hung rank costs (within --max-restarts): restart every rank "
                   "(default), or in-process: the other ranks keep their processes and state, "
                   "join a new group with a replacement for the lost rank, and go on from the "
                   "last completed step (ZeRO stage 0 engines; anything else falls back to a "
                   "restart). Default: the config's fault_tolerance.recover. docs/resilience.md.")
@click.option("--nnodes", default=None, metavar="MIN:MAX",
              help="Elastic range of hosts (torchrun's spelling; N = N:N): restarts go on while at "
                   "least MIN hosts answer; at most MAX are used. Default: the selected hosts, fixed.")
@click.option("--min_elastic_nodes", "--min-elastic-nodes", "min_elastic_nodes",
              type=click.IntRange(min=1), default=None, help="DeepSpeed's name for --nnodes MIN.")
@click.option("--max_elastic_nodes", "--max-elastic-nodes", "max_elastic_nodes",
              type=click.IntRange(min=1), default=None, help="DeepSpeed's name for --nnodes MAX.")
@click.option("--grace-period", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when ranks are stopped.")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Declare a node lost after this many seconds without a heartbeat from its agent "
                   "(counted from its first word; an agent that never reports is lost 30 s after the "
                   "launch).")
@click.option("--hang-timeout", type=click.FloatRange(min=0), default=None,
              help="Stop the job (or restart it, per --max-restarts) when no rank has made progress "
                   "(a training step, a collective) for this many seconds, with a report of where "
                   "each rank is; desynchronised collectives are reported at once. 0 disables. "
                   f"Default: the config's fault_tolerance.hang_timeout, else {HANG_TIMEOUT:g}.")
@click.option("--chdir", type=click.Path(), default=None,
              help="Working directory of the ranks (default: the current directory).")
@click.option("--python", "python", default=None,
              help="Interpreter for agents and ranks (default: the one running dslaunch).")
@click.option("--as-deepspeed", "as_deepspeed", is_flag=True,
              help="On every rank `import deepspeed` gives dslaunch (DSLAUNCH_AS_DEEPSPEED=1) and the "
                   "script gets --local_rank=N, as under DeepSpeed's launcher.")
@click.option("--inject", "inject_specs", multiple=True, metavar="SPEC",
              help="Inject a fault to rehearse recovery (repeatable; off by default): "
                   "kill:rank=R,step=N | hang:rank=R,step=N | slow:rank=R,step=N,seconds=S | "
                   "host-down:host=H,after=30s | link-down:host=H,after=30s; add attempt=N|all "
                   "(default 0). Rank faults also take at=SECONDS since the job started, once per "
                   "job (a schedule across restarts). docs/launcher.md, \"Rehearsing faults\".")
@click.option("--monitor", is_flag=True,
              help="Show a live table of the ranks (host, step, step time, compute and time in "
                   "collectives, tokens/s, memory, last heartbeat; redrawn in place on a terminal, "
                   "printed once at the end elsewhere) and a straggler report at the end. "
                   "`kill -USR1 <launcher pid>` prints the report at any time, with or without it. "
                   "With --log-dir DIR, `dslaunch top --log-dir DIR` shows the same table from "
                   "another terminal (DIR/status.json, replaced every second).")
@click.option("--straggler-threshold", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="A straggler's compute per step (its step time outside collectives) is more "
                   "than this fraction above the median of all ranks.")
@_extra_options
@deepspeed_options
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run(nproc_per_node, num_nodes, hostfile, include, exclude, master_addr, master_port, config,
        env_items, log_dir, launcher, dry_run, as_json, module, omp_threads, max_restarts, recover,
        nnodes,
        min_elastic_nodes, max_elastic_nodes, grace_period, heartbeat_timeout, hang_timeout, chdir,
        python, as_deepspeed, inject_specs, monitor, straggler_threshold, script, script_args,
        **runner_options):
    """Run SCRIPT (or, with -m, a module) on every selected slot; ARGS go to it untouched."""
    from dslaunch.launcher.resources import ResourceError, select_with_spares

    if script.startswith("-") and script != "-":
        raise click.UsageError(f"no such option: {script}")
    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run")
    no_ssh, node_rank = runner_options.pop("no_ssh"), runner_options.get("node_rank")
    no_local_rank = runner_options.pop("no_local_rank")  # turns off --as-deepspeed's --local_rank
    bind_cores, bind_core_list = runner_options.pop("bind_cores"), runner_options.pop("bind_core_list")
    run_id = runner_options.pop("run_id")
    if node_rank is not None and not no_ssh:
        raise click.UsageError("--node_rank goes with --no_ssh (the launcher numbers the nodes itself)")
    if no_ssh and launcher:
        raise click.UsageError("--no_ssh starts this node's ranks itself: leave out --launcher")
    if no_ssh and max_restarts:
        raise click.UsageError("--max-restarts with --no_ssh: each node's launcher would restart "
                               "only its own ranks; restart the whole job from outside instead")
    if bind_core_list and not bind_cores:
        raise click.UsageError("--bind_core_list goes with --bind_cores_to_rank")
    if bind_core_list:
        from dslaunch.launcher.cores import CoreListError, parse_core_list

        try:
            parse_core_list(bind_core_list)
        except CoreListError as exc:
            raise click.UsageError(str(exc)) from None

    spare_names: set = set()
    hosts, _source = _hosts(hostfile, nproc_per_node, (launcher or "").lower(), spare_names)
    try:
        selection, spares = select_with_spares(hosts, spare_names, include=include, exclude=exclude,
                                               num_nodes=num_nodes, nproc_per_node=nproc_per_node)
    except ResourceError as exc:
        raise click.ClickException(str(exc)) from None
    selection, spares, elastic = _elastic(selection, spares, nnodes, min_elastic_nodes,
                                          max_elastic_nodes, no_ssh)
    world_size = sum(len(s) for s in selection.values())
    faults = _faults(inject_specs, [*selection, *spares], world_size)  # a spare may be named too
    if no_ssh:
        from dslaunch.launcher.runners.nossh import NoSSHRunner

        runner_cls, launcher = NoSSHRunner, "no_ssh"
        master_port = master_port or NO_SSH_PORT
        run_id = run_id or no_ssh_run_id(selection, master_addr, master_port)
    else:
        launcher = launcher_name(launcher, selection)
        try:
            runner_cls = get_runner(launcher)
        except RunnerError as exc:
            raise click.UsageError(str(exc)) from None

    cwd = Path(chdir).resolve() if chdir else Path.cwd()
    if launcher in ("local", "no_ssh"):
        if not cwd.is_dir():
            raise click.ClickException(f"--chdir {chdir}: no such directory")
        if not module and not (cwd / script).is_file():
            raise click.ClickException(f"script not found: {script}")

    config_json = _config(config, world_size) if config else None
    script_configs = _script_configs(script_args, cwd, world_size, launcher in ("local", "no_ssh"))
    if config and script_configs and script_configs[-1][2] != str(Path(config).resolve()):
        flag, value = script_configs[-1][:2]
        click.echo(f"note: --config {config} goes to the ranks in DSLAUNCH_CONFIG, and the script "
                   f"is also given {flag} {value}: dslaunch.initialize(args=...) reads the "
                   "script's (as DeepSpeed does); both were checked", err=True)
    # the launcher's own settings (fault_tolerance): --config, else the script's DeepSpeed config
    launcher_config = config_json or (script_configs[-1][3] if script_configs else None)
    env, env_sources = _env(env_items, cwd)
    if as_deepspeed:
        env["DSLAUNCH_AS_DEEPSPEED"], env_sources["DSLAUNCH_AS_DEEPSPEED"] = "1", "--as-deepspeed"
    if faults:
        from dslaunch.launcher import inject

        env[inject.ENV], env_sources[inject.ENV] = inject.encode(faults), "--inject"
    program = (["-m", script] if module else [script]) + list(script_args)
    plan = build_plan(
        selection, program=program, launcher=launcher, master_addr=master_addr,
        master_port=master_port, env=env, env_sources=env_sources, cwd=str(cwd),
        python=python or sys.executable, config=config_json,
        config_path=str(Path(config).resolve()) if config else None,
        log_dir=str(Path(log_dir).resolve()) if log_dir else None, omp_threads=omp_threads,
        grace_period=grace_period, max_restarts=max_restarts, run_id=run_id,
        bind_cores=bind_cores, bind_core_list=bind_core_list,
        local_rank_arg=as_deepspeed and not no_local_rank,
    )
    plan.spares, plan.nnodes = spares, [elastic.min_nodes, elastic.max_nodes]
    plan.recover = _recover(recover, launcher_config)
    runner = runner_cls(plan, runner_options)
    try:
        runner.validate()
        plan.commands = runner.display_commands()
    except RunnerError as exc:
        raise click.ClickException(str(exc)) from None

    if dry_run:
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            _print_summary(plan)
        return
    try:
        if not runner_options.get("no_preflight"):
            runner.preflight()
    except RunnerError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        rc = runner.run(heartbeat_timeout=heartbeat_timeout,
                        hang_timeout=_hang_timeout(hang_timeout, launcher_config), elastic=elastic,
                        monitor=monitor, straggler_threshold=straggler_threshold)
    finally:
        if faults:  # the at= faults' once-per-job markers on this host (launcher/inject.py)
            from dslaunch.launcher import inject

            inject.forget(env[inject.ENV])
    sys.exit(rc)


__all__ = ["run", "LOCAL_HOSTS"]
