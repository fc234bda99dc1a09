"""WorldPlan: everything a job needs, resolved once on the launching host.

The plan is plain data (JSON). ``--dry-run --json`` prints it, and each agent receives it whole
(base64 of the JSON, one argv word), so the program argv, the environment and the config travel as
data and are never spliced into a shell string: hostile arguments arrive byte-identical.

The environment is the exception: a process's argv is world-readable (``ps``, /proc/PID/cmdline)
on every host, and the environment carries tokens (HF_TOKEN, WANDB_API_KEY). So when the runner
has a private channel (``env_channel``) the encoded plan holds no environment, and the values
reach each agent as one line on its stdin (``stdin``) or in a variable of the fan-out process's
environment, which only the job's user can read (``environ``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shlex
import socket
import sys
import uuid
from dataclasses import dataclass, field

# How each rank's output lines are prefixed. The local runner uses the first; multi-host runners
# set the second so users see which host a line came from.
LOCAL_PREFIX = "[rank {rank}] "
HOST_PREFIX = "[{host}:{rank}] "

# Hosts that mean "this machine"; a plan made only of these runs with the local runner and
# defaults MASTER_ADDR to 127.0.0.1 (as torchrun does) rather than a name that may resolve to ::1.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")

# The private environment channel: the stdin line's first word, and the variable's name.
ENV_LINE = "env"
ENV_VAR = "DSLAUNCH_PLAN_ENV"


def encode_env(env: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(env, separators=(",", ":")).encode()).decode("ascii")


def decode_env(text: str) -> dict:
    env = json.loads(base64.urlsafe_b64decode(text.strip().encode("ascii")).decode())
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("the private environment is not a name -> string mapping")
    return env


@dataclass
class WorldPlan:
    world_size: int
    master_addr: str
    master_port: int
    launcher: str
    nodes: list  # [{"host", "node_rank", "slots": [...], "ranks": [...]}]
    env: dict = field(default_factory=dict)  # name -> value, set on every rank
    env_sources: dict = field(default_factory=dict)  # name -> where the value came from
    commands: list = field(default_factory=list)  # the runner's per-node command lines (display)
    # What the agent needs to start ranks.
    program: list = field(default_factory=list)  # ["-m", module, *args] or [script, *args]
    cwd: str = ""
    python: str = sys.executable
    config: str | None = None  # the config JSON as written, validated (DSLAUNCH_CONFIG), or None
    config_path: str | None = None
    log_dir: str | None = None
    omp_threads: int | None = None  # None: cores // local ranks unless OMP_NUM_THREADS is set
    grace_period: float = 5.0
    heartbeat_interval: float = 1.0
    # > 0: the controller pings each agent every heartbeat_interval, and an agent that hears
    # nothing from it for this long stops its ranks (fencing: elastic.py); 0: no pings (runners
    # without a channel to each agent)
    fence_timeout: float = 0.0
    line_prefix: str = LOCAL_PREFIX
    max_restarts: int = 0
    # "restart": a failure stops every rank and the job starts again; "in-process": survivors
    # keep running and only the lost ranks start again (engine/recovery/)
    recover: str = "restart"
    env_channel: str = ""  # "" (env inside the encoded plan), "stdin" or "environ": see above
    run_id: str = ""  # TORCHELASTIC_RUN_ID of every rank: one id per job, kept across restarts
    bind_cores: bool = False  # pin each rank to its share of the host's cores (--bind_cores_to_rank)
    bind_core_list: str | None = None  # the cores to share out ("0-3,8"); None: the agent's cores
    local_rank_arg: bool = False  # append --local_rank=N to each rank's argv (DeepSpeed's launcher)
    spares: dict = field(default_factory=dict)  # host -> slot ids: not planned, for elastic restarts
    nnodes: list = field(default_factory=list)  # [MIN, MAX] hosts (--nnodes); [] = this plan's count

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "WorldPlan":
        names = {f.name for f in dataclasses.fields(cls)}
        # Unknown keys are ignored so a newer launcher can talk to an older agent.
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls, text: str) -> "WorldPlan":
        return cls.from_dict(json.loads(text))

    def encode(self) -> str:
        """base64 of the JSON (without display-only fields): safe as one argv word, even over ssh.
        With a private ``env_channel`` the environment is left out (it travels that way)."""
        data = self.to_dict()
        for display_only in ("commands", "env_sources", "spares", "nnodes"):
            data.pop(display_only, None)
        if self.env_channel:
            data["env"] = {}
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> "WorldPlan":
        return cls.from_json(base64.urlsafe_b64decode(text.encode("ascii")).decode())

    # ---- queries -------------------------------------------------------------------------------
    def node(self, node_rank: int) -> dict:
        return self.nodes[node_rank]

    def prefix(self, rank: int, host: str) -> str:
        return self.line_prefix.format(rank=rank, host=host)

    def prefixes(self) -> dict:
        """Display prefix -> global rank, for every rank (the controller routes lines to log files)."""
        return {self.prefix(r, n["host"]): r for n in self.nodes for r in n["ranks"]}

    def host_of(self, rank: int) -> str:
        for n in self.nodes:
            if rank in n["ranks"]:
                return n["host"]
        raise KeyError(rank)

    def rank_command(self) -> str:
        """What each rank runs (display only; the agent builds the real argv)."""
        argv = [self.python, "-u", "-m", "dslaunch.launcher.bootstrap",
                *self.rank_program("<LOCAL_RANK>")]
        return shlex.join(argv)

    def rank_program(self, local_rank) -> list:
        """``program`` as one rank runs it: with ``local_rank_arg``, ``--local_rank=N`` right after
        the script (or module), before its arguments, where DeepSpeed's launcher puts it."""
        if not self.local_rank_arg:
            return list(self.program)
        at = 2 if self.program[:1] == ["-m"] else 1
        return [*self.program[:at], f"--local_rank={local_rank}", *self.program[at:]]


def build_plan(
    selection: dict,
    *,
    program: list,
    launcher: str = "local",
    master_addr: str | None = None,
    master_port: int | None = None,
    env: dict | None = None,
    env_sources: dict | None = None,
    cwd: str | None = None,
    python: str | None = None,
    config: str | None = None,
    config_path: str | None = None,
    log_dir: str | None = None,
    omp_threads: int | None = None,
    grace_period: float = 5.0,
    line_prefix: str | None = None,
    max_restarts: int = 0,
    run_id: str | None = None,
    bind_cores: bool = False,
    bind_core_list: str | None = None,
    local_rank_arg: bool = False,
) -> WorldPlan:
    """Number ranks host by host in plan order; ``selection`` is host -> slot ids (ordered)."""
    nodes, next_rank = [], 0
    for node_rank, (host, slots) in enumerate(selection.items()):
        ranks = list(range(next_rank, next_rank + len(slots)))
        next_rank += len(slots)
        nodes.append({"host": host, "node_rank": node_rank, "slots": list(slots), "ranks": ranks})
    all_local = all(n["host"] in LOCAL_HOSTS for n in nodes)
    if master_addr is None:
        master_addr = "127.0.0.1" if all_local else nodes[0]["host"]
    if master_port is None:
        master_port = free_port()
    if line_prefix is None:
        line_prefix = LOCAL_PREFIX if len(nodes) == 1 and all_local else HOST_PREFIX
    return WorldPlan(
        world_size=next_rank,
        master_addr=master_addr,
        master_port=master_port,
        launcher=launcher,
        nodes=nodes,
        env=dict(env or {}),
        env_sources=dict(env_sources or {}),
        program=list(program),
        cwd=cwd or os.getcwd(),
        python=python or sys.executable,
        config=config,
        config_path=config_path,
        log_dir=log_dir,
        omp_threads=omp_threads,
        grace_period=grace_period,
        line_prefix=line_prefix,
        max_restarts=max_restarts,
        run_id=run_id or str(uuid.uuid4()),  # the form torchrun uses
        bind_cores=bind_cores,
        bind_core_list=bind_core_list,
        local_rank_arg=local_rank_arg,
    )


def replan(plan: WorldPlan, selection: dict) -> WorldPlan:
    """The plan of an elastic restart on ``selection`` (host -> slot ids): ranks renumbered host by
    host, a fresh master port (the old one may linger in TIME_WAIT, or on a host that is gone), and
    the master moved to the new first host when it was a host the new plan no longer has. A
    master address that names no host of the old plan (an IP, a service name) is the user's: kept."""
    old_hosts = {n["host"] for n in plan.nodes}
    nodes, next_rank = [], 0
    for node_rank, (host, slots) in enumerate(selection.items()):
        ranks = list(range(next_rank, next_rank + len(slots)))
        next_rank += len(slots)
        nodes.append({"host": host, "node_rank": node_rank, "slots": list(slots), "ranks": ranks})
    master = plan.master_addr
    if master in old_hosts and master not in selection:
        master = nodes[0]["host"]
    return dataclasses.replace(plan, nodes=nodes, world_size=next_rank, master_addr=master,
                               master_port=free_port())


def free_port() -> int:
    """A TCP port free on this host right now (the kernel picks it; torchrun does the same)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
