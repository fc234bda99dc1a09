"""``--no_ssh --node_rank N``: this launcher starts only node N's ranks, here, and reaches no other
host. Every node of the hostfile runs the same command with its own ``--node_rank`` (a Kubernetes
indexed job, a cluster without ssh between nodes); the ranks meet at MASTER_ADDR:MASTER_PORT, so
every node must be given the same hostfile, selection, address and port. The plan is the whole
job's (global ranks, world size, TORCHELASTIC_RUN_ID derived from what every node shares), so each
node numbers its ranks exactly as a single launcher would.

The job is one job for torch, but each launcher watches only its own node: a failure elsewhere
reaches this node's ranks as a broken connection (they fail, this launcher reports it), not as a
stop sent by a peer launcher.
"""

from __future__ import annotations

from dslaunch.launcher.runners.base import RunnerError
from dslaunch.launcher.runners.local import LocalRunner


class NoSSHRunner(LocalRunner):
    name = "no_ssh"

    def node_rank(self) -> int:
        return int(self.options["node_rank"])

    def validate(self) -> None:
        n, count = self.options.get("node_rank"), len(self.plan.nodes)
        if n is None or not 0 <= int(n) < count:
            raise RunnerError(f"--no_ssh needs --node_rank between 0 and {count - 1} (the plan has "
                              f"{count} node(s): {', '.join(x['host'] for x in self.plan.nodes)}), "
                              f"got {n}")

    def agent_specs(self, restart_count: int = 0) -> list:
        node = self.plan.node(self.node_rank())
        return [{"argv": self.agent_argv(node, restart_count), "node_ranks": [node["node_rank"]],
                 "label": node["host"]}]
