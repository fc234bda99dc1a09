"""MPI runners (``openmpi``, ``mpich``): mpirun / mpiexec is only the fan-out.

Choice: mpirun starts ONE process per node (``--map-by ppr:1:node`` / ``-ppn 1``): the nodeshim,
which finds its node rank in OMPI_COMM_WORLD_RANK / PMI_RANK and execs the ordinary agent, which
spawns that node's ranks. So fail-fast, heartbeats, logs, the traceback report and the
no-orphan guarantees are the same code as with ssh, and ranks get the torchrun variables (RANK,
LOCAL_RANK, ...) rather than having to read MPI's. The MPI runtime's per-process rank variables
are removed before the agent starts (they would describe the agent, not the rank).

Control channel: Open MPI forwards the launcher's stdin to every agent (``--stdin all``). MPICH's
hydra forwards stdin to its rank 0 only, so a stop is also sent as SIGINT to mpiexec, which hydra
passes to every process (the agent stops its ranks on SIGINT), and the job's environment goes to
the agents in a variable of mpiexec's environment (hydra forwards it whole), not on stdin.

Output: Open MPI forwards each agent's output in chunks that end anywhere, not at line ends, and
writes them to one stream as they come, so two nodes' lines mix even when every line is short.
So it runs with ``--tag-output`` (5.x: ``--output tag``), which marks each chunk's start with its
source (``[1,N]<stdout>:``, 5.x with a space after it), and ``TaggedStream`` puts each node's
lines back together. Tested with 4.1 here; the 5.x form (a space after the tag) as other tools
parse it, untested. Hydra's proxies read 64 KiB at a time: lines stay whole because the agent
writes each line (at most 1000 bytes: launcher/events.py) with its own write.

Options: ``--launcher-args`` go to mpirun/mpiexec (e.g. ``--mca btl_tcp_if_include eth0`` or
``-iface eth0``); MCA settings can also come from ``OMPI_MCA_*`` variables and hydra's from
``HYDRA_*`` ones in the launcher's environment. ``--ssh-port/--ssh-args`` reach the runtime's ssh
launcher (Open MPI: ``plm_rsh_args``; hydra: HYDRA_LAUNCHER_EXTRA_ARGS).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess

from dslaunch.launcher.plan import ENV_VAR, encode_env
from dslaunch.launcher.runners import remote
from dslaunch.launcher.runners.base import Runner, RunnerError


class TaggedStream:
    """The lines of an ``mpirun --tag-output`` stream (``stdout`` or ``stderr``) as each node
    wrote them: ``feed(raw)`` takes one line of the stream and gives back the whole lines it
    completes, tags removed; a chunk that ends inside a line waits for its node's next one."""

    def __init__(self, stream: str = "stdout", after: bytes = b"") -> None:
        # Open MPI 4: ``[1,0]<stdout>:text``; 5 (``--output tag``) puts a space after the colon
        self.tag = re.compile(rb"\[\d+,(\d+)\]<" + stream.encode() + rb">:" + re.escape(after))
        self.partial: dict = {}  # source (None: untagged text, mpirun's own) -> bytes so far

    def feed(self, raw: bytes) -> list:
        pieces, start, source = [], 0, None
        for m in self.tag.finditer(raw):
            if m.start() > start:
                pieces.append((source, raw[start:m.start()]))
            start, source = m.end(), int(m.group(1))
        pieces.append((source, raw[start:]))
        done = []
        for source, chunk in pieces:
            text = self.partial.pop(source, b"") + chunk
            if text.endswith(b"\n"):
                done.append(text)
            elif text:
                self.partial[source] = text
        return done

    def rest(self) -> list:
        """What the stream ended in the middle of (a node that died mid-line)."""
        done, self.partial = [t + b"\n" for t in self.partial.values()], {}
        return done


class MPIRunner(Runner):
    name = "mpi"
    queries = False  # send() interrupts the whole job (only node 0's agent reads our stdin)
    binaries: tuple = ()
    rank_from = ""

    def binary(self) -> str:
        for b in self.binaries:
            path = shutil.which(b)
            if path:
                return path
        raise RunnerError(f"--launcher {self.name}: none of {', '.join(self.binaries)} is installed")

    def validate(self) -> None:
        self.binary()
        remote.user_words(self.options.get("launcher_args"), "--launcher-args")
        remote.user_words(self.options.get("ssh_args"), "--ssh-args")

    def shim_argv(self, restart_count: int) -> list:
        argv = [self.plan.python, "-m", "dslaunch.launcher.runners.nodeshim", "--plan",
                self.plan.encode(), "--rank-from", self.rank_from]
        if restart_count:
            argv += ["--restart-count", str(restart_count)]
        return argv

    def ssh_words(self) -> list:
        words = list(remote.SSH_KEEPALIVE)
        if self.options.get("ssh_port"):
            words += ["-p", str(self.options["ssh_port"])]
        return words + remote.user_words(self.options.get("ssh_args"), "--ssh-args")

    def fanout_argv(self, hosts: list) -> list:
        raise NotImplementedError

    def fanout_env(self) -> dict:
        return dict(os.environ)

    def agent_specs(self, restart_count: int = 0) -> list:
        hosts = [n["host"] for n in self.plan.nodes]
        argv = (self.fanout_argv(hosts)
                + remote.user_words(self.options.get("launcher_args"), "--launcher-args")
                + self.shim_argv(restart_count))
        return [{"argv": argv, "node_ranks": [n["node_rank"] for n in self.plan.nodes],
                 "label": self.name, "popen_kwargs": {"env": self.fanout_env()},
                 "output_demux": self.output_demux}]

    output_demux = None  # a TaggedStream factory where the runtime mixes the nodes' chunks

    def kill(self, agent) -> None:
        remote.terminate_then_kill(agent)


def open_mpi_major(binary: str) -> int:
    """Open MPI's major version from ``mpirun --version`` (4 when it cannot be told)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 4
    m = re.search(r"Open MPI\)? (\d+)\.", out.stdout + out.stderr)
    return int(m.group(1)) if m else 4


class OpenMPIRunner(MPIRunner):
    name = "openmpi"
    binaries = ("mpirun.openmpi", "mpirun")
    rank_from = "openmpi"

    @functools.cached_property
    def major(self) -> int:
        return open_mpi_major(self.binary())

    @property
    def output_demux(self):
        return functools.partial(TaggedStream, after=b" " if self.major >= 5 else b"")

    def fanout_argv(self, hosts: list) -> list:
        argv = [self.binary()]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        argv += ["-np", str(len(hosts)), "--host", ",".join(f"{h}:1" for h in hosts),
                 "--map-by", "ppr:1:node", "--bind-to", "none",  # the agent's ranks use every core
                 "--stdin", "all", *(["--output", "tag"] if self.major >= 5 else ["--tag-output"])]
        words = self.ssh_words()
        if words:
            argv += ["--mca", "plm_rsh_args", " ".join(words)]
        return argv


class MPICHRunner(MPIRunner):
    name = "mpich"
    binaries = ("mpiexec.mpich", "mpiexec.hydra")
    rank_from = "mpich"
    env_channel = "environ"

    def fanout_argv(self, hosts: list) -> list:
        return [self.binary(), "-n", str(len(hosts)), "-ppn", "1", "-hosts", ",".join(hosts)]

    def fanout_env(self) -> dict:
        env = dict(os.environ)
        words = self.ssh_words()
        if words:
            env["HYDRA_LAUNCHER_EXTRA_ARGS"] = " ".join(words)
        env[ENV_VAR] = encode_env(self.plan.env)
        return env

    def send(self, agent, command: str) -> None:
        super().send(agent, command)  # reaches node 0's agent (with the stack dump on failure)
        try:
            os.kill(agent.proc.pid, signal.SIGINT)  # hydra passes it to every agent
        except ProcessLookupError:
            pass
