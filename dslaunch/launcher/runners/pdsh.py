"""``--launcher pdsh``: ONE pdsh process fans out to every host (``pdsh -S -N -R ssh -w h1,h2``);
pdsh's ``%n`` (the host's index in the ``-w`` list, which pdsh keeps in order) becomes the
agent's ``--node-rank``. pdsh does not forward stdin, so ``stop`` cannot be written to the agents:
stopping the job ends the pdsh process group, the ssh connections close, and each agent sees EOF on
its stdin and stops its ranks (SIGTERM, grace period, SIGKILL). The ranks' last output after a
stop is therefore not shown (the root cause has already been reported by then).

Gotchas handled (INFRA.md): Debian's pdsh defaults to rsh (we pass ``-R ssh``), pdsh exits 0
when remote commands fail unless ``-S``, and pdsh does not forward the environment (ours travels
inside the plan, so it is visible in ``ps`` on the hosts: the job start says so when it holds
names that look like credentials).
"""

from __future__ import annotations

import os
import shutil
import signal

from dslaunch.launcher.runners import remote
from dslaunch.launcher.runners.base import Runner, RunnerError


class PdshRunner(Runner):
    name = "pdsh"
    env_channel = ""  # pdsh forwards neither our stdin nor our environment
    queries = False  # send() stops the agents (no stdin reaches them)

    def validate(self) -> None:
        for w in self._ssh_words():
            if any(c.isspace() for c in w):
                raise RunnerError(f"--ssh-args with pdsh: pdsh splits its ssh arguments on spaces, "
                                  f"so {w!r} cannot be passed; use ~/.ssh/config instead")
        remote.user_words(self.options.get("launcher_args"), "--launcher-args")
        if shutil.which("pdsh") is None:
            raise RunnerError("--launcher pdsh: 'pdsh' is not installed on this host")

    def _ssh_words(self) -> list:
        words = [*remote.SSH_BASE, *remote.SSH_KEEPALIVE]
        if self.options.get("ssh_port"):
            words += ["-p", str(self.options["ssh_port"])]
        return words + remote.user_words(self.options.get("ssh_args"), "--ssh-args")

    def agent_specs(self, restart_count: int = 0) -> list:
        hosts = [n["host"] for n in self.plan.nodes]
        argv = self.agent_argv(self.plan.nodes[0], restart_count)
        i = argv.index("--node-rank")
        # pdsh expands %h %u %n %%: escape every '%' of ours, then add the one placeholder.
        words = [w.replace("%", "%%") for w in argv]
        words[i + 1] = "%n"
        cmd = ["pdsh", "-S", "-N", "-R", "ssh", "-w", ",".join(hosts),
               "-f", str(self.options.get("pdsh_fanout") or max(32, len(hosts))),
               *remote.user_words(self.options.get("launcher_args"), "--launcher-args"),
               remote.agent_words(words)]
        env = dict(os.environ)
        env["PDSH_RCMD_TYPE"] = "ssh"
        env["PDSH_SSH_ARGS_APPEND"] = " ".join(self._ssh_words())
        return [{"argv": cmd, "node_ranks": [n["node_rank"] for n in self.plan.nodes],
                 "label": "pdsh", "popen_kwargs": {"env": env}}]

    def send(self, agent, command: str) -> None:
        # No stdin reaches the agents through pdsh: closing the connections is the stop signal.
        try:
            os.killpg(agent.proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
