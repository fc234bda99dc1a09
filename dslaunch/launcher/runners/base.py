"""Runner base: how the agents of a job are started. The job itself is run by the shared
``JobController``; a runner only says which command starts the agent of each node, how to send it
a command line, and how to kill it.

A multi-host runner overrides ``agent_specs`` (or just ``wrap``) to put the agent command inside
ssh/pdsh/srun/mpirun, ``validate`` to refuse early (binary missing, ...), and ``preflight`` to
check hosts before starting anything.
"""

from __future__ import annotations

import os
import shlex
import signal

from dslaunch.launcher import events
from dslaunch.launcher.plan import WorldPlan


class RunnerError(Exception):
    """The runner cannot run this plan (one line, shown to the user)."""


class Runner:
    name = "base"

    def __init__(self, plan: WorldPlan, options: dict | None = None):
        self.plan = plan
        self.options = dict(options or {})

    # ---- to override -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise RunnerError when this runner cannot run the plan. Must start nothing."""

    def preflight(self) -> None:
        """Check the hosts before any rank starts (multi-host runners); raise RunnerError."""

    def wrap(self, node: dict, argv: list) -> list:
        """The command that runs ``argv`` (the agent) on ``node``; local: argv itself."""
        return argv

    # ---- shared ----------------------------------------------------------------------------------
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
        try:
            agent.proc.stdin.write(command.encode() + b"\n")
            agent.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # already gone: its EOF is being handled

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

    def run(self, heartbeat_timeout: float = 10.0) -> int:
        from dslaunch.launcher.controller import JobController

        return JobController(self.plan, self, heartbeat_timeout=heartbeat_timeout).run()


__all__ = ["Runner", "RunnerError", "events"]
