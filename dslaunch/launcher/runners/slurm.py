"""``--launcher slurm``: inside a SLURM allocation (``salloc`` / ``sbatch``), ONE ``srun`` starts one
task per node (``--ntasks-per-node 1``): the nodeshim, which finds its node by SLURMD_NODENAME
and execs the ordinary agent. ``--input all`` makes srun copy the launcher's stdin to every task,
so ``stop`` and EOF reach every agent as with ssh. Outside an allocation use ``dslaunch sbatch``.

Without ``-H``, the hosts are the allocation's nodes (``allocation_hosts``), with
``SLURM_NTASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``, else 1) slots each.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from dslaunch.launcher.runners import remote
from dslaunch.launcher.runners.base import Runner, RunnerError

KILL_AFTER = 3.0  # srun gets this long after SIGTERM to cancel its step before SIGKILL


def expand_nodelist(nodelist: str) -> list:
    """``host[1-3,7],gpu01`` -> names, via ``scontrol show hostnames`` (SLURM's own parser)."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        raise RunnerError(f"scontrol show hostnames {nodelist}: {out.stderr.strip()}")
    return out.stdout.split()


def _tasks_per_node(environ) -> list:
    """SLURM_TASKS_PER_NODE ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts = []
    for part in environ.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def allocation_hosts(environ=os.environ) -> dict:
    """``{node: slots}`` of the current allocation; RunnerError outside one."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not environ.get("SLURM_JOB_ID") or not nodelist:
        raise RunnerError("not inside a SLURM allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST)")
    names = expand_nodelist(nodelist)
    per = environ.get("SLURM_NTASKS_PER_NODE")
    counts = [int(per)] * len(names) if per and per.isdigit() else _tasks_per_node(environ)
    if len(counts) != len(names):
        counts = [1] * len(names)
    return dict(zip(names, counts))


class SlurmRunner(Runner):
    name = "slurm"
    probe_via = "srun"  # one srun step per host (the allocation is how hosts are reached)

    def validate(self) -> None:
        if not os.environ.get("SLURM_JOB_ID"):
            raise RunnerError("--launcher slurm runs inside a SLURM allocation (salloc or sbatch); "
                              "outside one, submit the job with `dslaunch sbatch`")
        if shutil.which("srun") is None:
            raise RunnerError("--launcher slurm: 'srun' is not installed on this host")
        remote.user_words(self.options.get("launcher_args"), "--launcher-args")

    def agent_specs(self, restart_count: int = 0) -> list:
        hosts = [n["host"] for n in self.plan.nodes]
        argv = ["srun", "--nodes", str(len(hosts)), "--ntasks", str(len(hosts)),
                "--ntasks-per-node", "1", "--nodelist", ",".join(hosts), "--input", "all",
                "--kill-on-bad-exit=0", *self._cpu_bind(), "--mpi=none", "--overlap",
                "--job-name", "dslaunch-agents",
                *remote.user_words(self.options.get("launcher_args"), "--launcher-args"),
                self.plan.python, "-m", "dslaunch.launcher.runners.nodeshim", "--plan",
                self.plan.encode(), "--rank-from", "slurm"]
        if restart_count:
            argv += ["--restart-count", str(restart_count)]
        return [{"argv": argv, "node_ranks": [n["node_rank"] for n in self.plan.nodes],
                 "label": "srun"}]

    def _cpu_bind(self) -> list:
        """``--cpu-bind=none`` where the cluster binds tasks (the agent's ranks need every core of
        the node, not the one core of its task); elsewhere srun would only warn about it."""
        if not hasattr(self, "_bind"):
            try:
                out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                     timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            plugin = next((ln for ln in out.splitlines() if ln.startswith("TaskPlugin ")), "")
            self._bind = ["--cpu-bind=none"] if ("affinity" in plugin or "cgroup" in plugin) else []
        return self._bind

    def kill(self, agent) -> None:
        # srun cancels its step (every task on every node) on SIGTERM; SIGKILL would leave the
        # step running until SLURM notices.
        remote.terminate_then_kill(agent, KILL_AFTER)

    @classmethod
    def probe_transport(cls, options: dict):
        def transport(host, command, timeout):
            return ["srun", "--nodes", "1", "--ntasks", "1", "--nodelist", host, "--overlap",
                    "--quiet", "--job-name", "dslaunch-preflight", "sh", "-c", command]

        return transport
