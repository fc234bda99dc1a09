"""The local runner: one agent subprocess per node, every node on this host."""

from __future__ import annotations

import os
import signal

from dslaunch.launcher.plan import LOCAL_HOSTS
from dslaunch.launcher.runners.base import Runner, RunnerError


class LocalRunner(Runner):
    name = "local"

    def validate(self) -> None:
        remote = [n["host"] for n in self.plan.nodes if n["host"] not in LOCAL_HOSTS]
        if remote:
            raise RunnerError(f"the local launcher runs only on this host, but the plan names "
                              f"{', '.join(remote)}; choose a multi-host --launcher (e.g. ssh)")

    def kill(self, agent) -> None:
        # The agent did not stop in time; its ranks live in their own sessions, so end them too.
        for pid in getattr(agent, "pids", {}).values():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
        super().kill(agent)
