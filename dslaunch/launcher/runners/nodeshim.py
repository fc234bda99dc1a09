"""``python -m dslaunch.launcher.runners.nodeshim --plan B64 --rank-from {openmpi,mpich,slurm}``

mpirun, mpiexec and srun start the SAME command on every node, so the agent's ``--node-rank``
cannot be written into it. This shim, started once per node (``-npernode 1`` / ``-ppn 1`` /
``--ntasks-per-node 1``), finds its node rank from what the MPI/SLURM runtime tells it, removes
that runtime's per-process rank variables (they describe the agent, not the ranks, and would
mislead a rank's ``MPI_Init`` or a fallback rank lookup), and execs the ordinary agent: same
protocol, same fail-fast, same logs as with ssh.
"""

from __future__ import annotations

import argparse
import os
import sys

from dslaunch.launcher.plan import WorldPlan

SCRUB_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
SCRUB = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE")


def node_rank(plan: WorldPlan, rank_from: str, environ=os.environ) -> int:
    if rank_from == "slurm":
        name = environ.get("SLURMD_NODENAME", "")
        hosts = [n["host"] for n in plan.nodes]
        short = [h.split(".")[0] for h in hosts]
        for names in (hosts, short):
            if name in names:
                return names.index(name)
        raise SystemExit(f"dslaunch nodeshim: SLURM node {name!r} is not in the plan ({', '.join(hosts)})")
    var = {"openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK"}[rank_from]
    value = environ.get(var)
    if value is None:
        raise SystemExit(f"dslaunch nodeshim: {var} is not set; was this started by {rank_from}?")
    n = int(value)
    if not 0 <= n < len(plan.nodes):
        raise SystemExit(f"dslaunch nodeshim: {var}={n} but the plan has {len(plan.nodes)} node(s)")
    return n


def main(argv: list | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dslaunch.launcher.runners.nodeshim")
    p.add_argument("--plan", required=True)
    p.add_argument("--rank-from", required=True, choices=["openmpi", "mpich", "slurm"])
    p.add_argument("--restart-count", type=int, default=0)
    args = p.parse_args(argv)
    plan = WorldPlan.decode(args.plan)
    n = node_rank(plan, args.rank_from)
    for k in list(os.environ):
        if k.startswith(SCRUB_PREFIXES) or k in SCRUB:
            del os.environ[k]
    agent = [sys.executable, "-m", "dslaunch.launcher.agent", "--plan", args.plan, "--node-rank", str(n)]
    if args.restart_count:
        agent += ["--restart-count", str(args.restart_count)]
    sys.stdout.flush()
    os.execv(sys.executable, agent)


if __name__ == "__main__":
    main()
