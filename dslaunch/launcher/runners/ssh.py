"""``--launcher ssh``: one OpenSSH client per host, started in parallel, each running that node's
agent. The ssh connection IS the control channel: the agent's stdin carries ``stop``; a dead
launcher or a dropped connection closes it (EOF), and the agent then stops its ranks. A
connection that stays open but carries nothing (a split network: no FIN, no RST) is caught by
the controller's pings: an agent that hears none for the heartbeat timeout stops its ranks
(fencing, ``elastic.py``). Honours
~/.ssh/config (the plain ``ssh`` client is used), ``--ssh-port`` and ``--ssh-args``.
"""

from __future__ import annotations

import shutil

from dslaunch.launcher.runners import remote
from dslaunch.launcher.runners.base import Runner, RunnerError


class SSHRunner(Runner):
    name = "ssh"
    fences = True
    adds_agents = True

    def validate(self) -> None:
        if shutil.which("ssh") is None:
            raise RunnerError("--launcher ssh: the OpenSSH client 'ssh' is not installed on this host")
        remote.user_words(self.options.get("ssh_args"), "--ssh-args")

    def wrap(self, node: dict, argv: list) -> list:
        return remote.ssh_argv(node["host"], self.options) + ["--", remote.agent_words(argv)]
