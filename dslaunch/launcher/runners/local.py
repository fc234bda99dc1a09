"""The local runner: one agent subprocess per node, every node on this host."""

from __future__ import annotations

import os
import signal

from dslaunch.launcher.plan import LOCAL_HOSTS
from dslaunch.launcher.runners.base import Runner, RunnerError


class LocalRunner(Runner):
    name = "local"
    probe_via = "local"

    @classmethod
    def check_hosts(cls, hosts: list) -> None:
        remote = [h for h in hosts if h not in LOCAL_HOSTS]
        if remote:
            raise RunnerError(f"the local launcher runs only on this host, but the plan names "
                              f"{', '.join(remote)}; choose a multi-host --launcher (e.g. ssh)")

    @classmethod
    def probe_transport(cls, options: dict):
        from dslaunch.launcher import hosts_check

        return hosts_check.local_transport

    def validate(self) -> None:
        self.check_hosts([n["host"] for n in self.plan.nodes])

    def preflight(self) -> None:
        """Nothing to reach: ``dslaunch run`` has checked the script and the directory here."""

    def kill(self, agent) -> None:
        # The agent did not stop in time; its ranks live in their own sessions, so end them too.
        for pid in getattr(agent, "pids", {}).values():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
        super().kill(agent)
