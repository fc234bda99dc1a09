"""Runner base: how the agents of a job are started. The job itself is run by the shared
``JobController``; a runner only says which command starts the agent of each node, how to send it
a command line, and how to kill it.

A multi-host runner overrides ``agent_specs`` (or just ``wrap``) to put the agent command inside
ssh/pdsh/srun/mpirun, and ``validate`` to refuse early (binary missing, ...). How the runner
reaches one host to look at it (``probe_via`` / ``probe_transport``: ssh unless it says otherwise)
serves both the preflight before a job and ``dslaunch hosts check``, so the two always check a host
the way the job would reach it.
"""

from __future__ import annotations

import os
import shlex
import signal

from dslaunch.launcher import events
from dslaunch.launcher.environment import is_secret
from dslaunch.launcher.plan import ENV_LINE, WorldPlan, encode_env


def _write_line(agent, line: str) -> None:
    """One line on the agent's stdin (a subclass's ``send`` may do more, e.g. signal it)."""
    try:
        agent.proc.stdin.write(line.encode() + b"\n")
        agent.proc.stdin.flush()
    except (OSError, ValueError):
        pass  # already gone: its EOF is being handled


PROBE_TIMEOUT = 3.0  # seconds an elastic restart waits for a host to answer


class RunnerError(Exception):
    """The runner cannot run this plan (one line, shown to the user)."""


class Runner:
    name = "base"
    # How the environment reaches the agents without appearing in any argv (plan.py): "stdin" when
    # the runner forwards our stdin to every agent, "environ" when it forwards our environment,
    # "" when neither (the environment then travels inside the plan, and notices() says so).
    env_channel = "stdin"
    # Whether ``send`` reaches each agent's stdin as a plain line, so that a query (``dump
    # stacks``) can be sent without stopping anything.
    queries = True
    # whether each agent hears this launcher directly (its own stdin, no relay): then the
    # controller pings the agents and one cut off stops its ranks (plan.fence_timeout)
    fences = False
    # whether one more agent can be started mid-job on one node (``wrap``, one process a node):
    # in-process recovery then moves a lost host's ranks onto a spare host
    adds_agents = False
    # How the preflight and ``dslaunch hosts check`` reach one host of this runner's jobs to probe
    # it (a word shown in their tables): "ssh" (the OpenSSH client, as the agents are started, or
    # as pdsh/mpirun start them), "srun" (slurm.py), "local" (this host itself: local.py).
    probe_via = "ssh"

    def __init__(self, plan: WorldPlan, options: dict | None = None):
        self.plan = plan
        self.options = dict(options or {})
        plan.env_channel = self.env_channel

    # ---- to override -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise RunnerError when this runner cannot run the plan. Must start nothing."""

    @classmethod
    def check_hosts(cls, hosts: list) -> None:
        """Raise RunnerError when this runner cannot reach ``hosts`` at all (local.py: a host
        that is not this one). Used by ``validate`` and by ``dslaunch hosts check``."""

    @classmethod
    def probe_transport(cls, options: dict):
        """``transport(host, remote_command, timeout) -> argv``: how a probe reaches a host of
        this runner's jobs (``probe_via``). ssh here, with ``--ssh-port`` / ``--ssh-args``."""
        from dslaunch.launcher import hosts_check

        return hosts_check.ssh_transport(options)

    def preflight(self) -> None:
        """Check the hosts before any rank starts, over ``probe_transport`` (reachable, same
        versions, working directory and script present, master port free); raise RunnerError
        with the table of what differs."""
        from dslaunch.launcher.preflight import run_preflight

        run_preflight(self.plan, self.options, self.probe_transport(self.options), self.probe_via)

    def wrap(self, node: dict, argv: list) -> list:
        """The command that runs ``argv`` (the agent) on ``node``; local: argv itself."""
        return argv

    # ---- shared ----------------------------------------------------------------------------------
    def notices(self) -> list:
        """One-line warnings shown when the job starts."""
        secrets = sorted(k for k in self.plan.env if is_secret(k))
        if self.env_channel or not secrets:
            return []
        return [f"--launcher {self.name} cannot hand the environment over privately: "
                f"{', '.join(secrets)} travel(s) inside the agents' command line, readable with "
                "`ps` on every host; use --launcher ssh, openmpi, mpich or slurm to keep it private"]

    def hand_over(self, agent) -> None:
        """Called once the agent process has started: give it what the plan leaves out."""
        if self.env_channel == "stdin":
            _write_line(agent, f"{ENV_LINE} {encode_env(self.plan.env)}")

    def agent_argv(self, node: dict, restart_count: int = 0) -> list:
        """The agent command for one node, as it must run on that node."""
        argv = [self.plan.python, "-m", "dslaunch.launcher.agent", "--plan", self.plan.encode(),
                "--node-rank", str(node["node_rank"])]
        if restart_count:
            argv += ["--restart-count", str(restart_count)]
        return argv

    def agent_specs(self, restart_count: int = 0) -> list:
        """One dict per agent process: argv, node_ranks (whose events it carries), label."""
        return [
            {"argv": self.wrap(n, self.agent_argv(n, restart_count)), "node_ranks": [n["node_rank"]],
             "label": n["host"]}
            for n in self.plan.nodes
        ]

    def display_commands(self) -> list:
        """The commands as a user would type them (the plan's ``commands``)."""
        return [shlex.join(spec["argv"]) for spec in self.agent_specs()]

    def send(self, agent, command: str) -> None:
        """Write one protocol command line to an agent (see events.py)."""
        _write_line(agent, command)

    def kill(self, agent) -> None:
        """Kill an agent that does not stop by itself. Closing its stdin first tells a remote agent
        (through ssh) to stop its ranks; killing its process group ends the local side."""
        try:
            agent.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            os.killpg(agent.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def probe(self, hosts: list) -> set:
        """The hosts that answer now (before an elastic restart): this host always; any other if
        ``ssh HOST true`` succeeds within ``PROBE_TIMEOUT`` seconds (all asked at once)."""
        import subprocess
        from concurrent.futures import ThreadPoolExecutor

        from dslaunch.launcher.plan import LOCAL_HOSTS
        from dslaunch.launcher.runners import remote

        def answers(host: str) -> bool:
            if host in LOCAL_HOSTS:
                return True
            argv = remote.ssh_argv(host, self.options, connect_timeout=PROBE_TIMEOUT - 1)
            try:
                return subprocess.run([*argv, "--", "true"], stdin=subprocess.DEVNULL,
                                      capture_output=True, timeout=PROBE_TIMEOUT).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False

        if not hosts:
            return set()
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            return {h for h, ok in zip(hosts, pool.map(answers, hosts)) if ok}

    def run(self, heartbeat_timeout: float | None = None, hang_timeout: float = 0.0,
            elastic=None, **view) -> int:
        """``view``: the live job view's options (``monitor``, ``straggler_threshold``)."""
        from dslaunch.launcher.controller import HEARTBEAT_TIMEOUT, JobController

        heartbeat_timeout = heartbeat_timeout or HEARTBEAT_TIMEOUT
        self.plan.fence_timeout = heartbeat_timeout if self.fences else 0.0
        return JobController(self.plan, self, heartbeat_timeout=heartbeat_timeout,
                             hang_timeout=hang_timeout, elastic=elastic, **view).run()


__all__ = ["Runner", "RunnerError", "events"]
