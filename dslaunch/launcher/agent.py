"""Per-node agent: ``python -m dslaunch.launcher.agent --plan <b64> --node-rank N``.

Starts this node's ranks (each under the bootstrap, in its own session so a signal reaches its
whole process group and nothing else), streams their output prefixed for display, reports events,
and stops everything on request. It talks to the launcher ONLY through stdin/stdout (protocol in
``events.py``), so the same agent works as a local subprocess and over ssh, where EOF on stdin is
how a dead launcher or a broken connection is noticed. A connection that stays open but carries
nothing (a split network) is noticed by fencing: with ``plan.fence_timeout`` the launcher pings
every heartbeat interval, and an agent that hears nothing for that long kills its ranks and exits,
so the launcher may restart the job elsewhere without two halves training.

Fail fast on this node: when one of its ranks fails, the agent stops the others itself at once
(the launcher then stops the other nodes); with ``--recover in-process`` it leaves them running
and waits for the launcher's word instead: ``recover`` (survivors get an instruction file, lost
ranks start again as replacements: ``agent_recovery.py``) or a stop. What it reads from its ranks
for the launcher (progress, memory, stacks) is ``agent_diagnostics.py``. No torch here: starting
ranks must stay cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from dslaunch import progress_record, recover_files
from dslaunch.launcher import agent_diagnostics as diagnostics
from dslaunch.launcher import errors, events, inject
from dslaunch.launcher.agent_recovery import InProcessRecovery
from dslaunch.launcher.bootstrap import STACK_FILE_ENV
from dslaunch.launcher.cores import CoreListError, format_cores, rank_cores
from dslaunch.launcher.node_lock import node_lock, node_lock_path
from dslaunch.launcher.plan import ENV_LINE, ENV_VAR, WorldPlan, decode_env, free_port
from dslaunch.launcher.rank_process import TAIL_LINES, Rank

DUMP_WAIT = 0.5  # seconds between the SIGUSR1 stack dump and SIGTERM (the dump is written at once)
PREVIOUS_ATTEMPT_WAIT = 60.0  # beyond the grace period: how long a restarted agent waits for the
# previous attempt's agent on its node to have stopped its ranks (see node_lock)
READER_JOIN = 2.0  # how long an exit waits for the rank's last output to be streamed


def detect_gpus() -> bool:
    """Whether this host has NVIDIA GPUs, without importing torch."""
    try:
        if os.listdir("/proc/driver/nvidia/gpus"):
            return True
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Agent(InProcessRecovery):
    def __init__(self, plan: WorldPlan, node_rank: int | None, restart_count: int = 0, out=None,
                 join: dict | None = None, warm_spare: dict | None = None):
        self.plan, self.node_rank, self.restart_count = plan, node_rank, restart_count
        # in-process recovery onto a spare host: our ranks start as replacements that join the
        # survivors' new group (the launcher's recover word for them), not as a new job
        self.join = join
        # a warm spare (``warm_spare``: {"host", "slots"} of this spare host): no node and no
        # rank of its own, only standby processes, until the launcher gives it a lost host's
        # node (``adopt``)
        self.warm = warm_spare is not None
        self.node = (plan.node(node_rank) if not self.warm else
                     {"host": warm_spare["host"], "slots": list(warm_spare["slots"]), "ranks": [],
                      "node_rank": None})
        self.host = self.node["host"]
        self.out = out or sys.stdout.buffer
        self.out_lock = threading.Lock()
        self.out_broken = False
        self.queue: queue.Queue = queue.Queue()
        self.ranks: list[Rank] = []
        self.stopping = threading.Event()  # set once a stop has begun
        self.stop_time: float | None = None  # when our stop began: see errors.caused_by_stop
        self.escalate = threading.Event()  # kill now, skip the grace period
        self.all_exited = threading.Event()
        self.stop_lock = threading.Lock()
        self.stopper: threading.Thread | None = None
        self.signalled: str | None = None
        self.tmpdir = tempfile.mkdtemp(prefix="dslaunch-agent-")
        self.silent = False  # --inject host-down fired: this host plays dead (launcher/inject.py)
        # --recover in-process: after a rank failed, wait for the launcher's word (recover or
        # stop) even if no rank of ours runs any more; the answers still to forward
        self.awaiting_word = False
        self.pending_acks: dict = {}  # local rank -> (rank, epoch)
        self.started_acks: dict = {}  # local rank -> the epoch whose "recovering" went out
        # warm processes, each of which becomes a lost rank at once (one per node; a warm
        # spare's: one per rank of the largest node, as many as its slots allow)
        self.standby_pool: list[Rank] = []
        self.standbys = 0  # how many were started (their file names)

    # ---- output ----------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        with self.out_lock:
            if self.out_broken or self.silent:
                return
            try:
                # one write per wire line: a write of at most PIPE_BUF bytes lands in the pipe
                # whole, so hydra's proxy, which reads our pipe 64 KiB at a time, never reads
                # half a line (a many-line write can be read cut anywhere, and another node's
                # output then lands inside the line)
                for line in events.frame(data):
                    self.out.write(line)
                    self.out.flush()
            except (OSError, ValueError):
                # The launcher (or the ssh connection) is gone: nobody to report to, stop the ranks.
                self.out_broken = True
                self.queue.put(("command", "eof"))

    def event(self, name: str, **fields) -> None:
        fields.setdefault("node_rank", self.node_rank)
        fields.setdefault("host", self.host)
        self.write(events.format_event(name, **fields))

    # ---- injected faults (launcher/inject.py: HostFaults calls these) --------------------------
    def say(self, text: str) -> None:
        if not self.silent:
            sys.stderr.write(f"dslaunch agent on {self.host}: {text}\n")
            sys.stderr.flush()

    def silence(self) -> None:
        with self.out_lock:
            self.silent = True

    def kill_ranks(self) -> None:
        self._signal_groups(signal.SIGKILL, self.ranks)

    def _play_dead(self) -> None:
        """After host-down: no event, no output, no command obeyed, yet alive (an exit would
        look like a crashed agent, not a lost host), until the launcher drops the connection."""
        deadline = time.monotonic() + inject.SILENT_CAP
        while time.monotonic() < deadline:
            try:
                kind, item = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "command" and item == "eof":
                return

    # ---- starting ranks ------------------------------------------------------------------------
    def rank_env(self, rank: int, local_rank: int, gpus: bool, torch_error_file: str = "",
                 cores: list | None = None) -> dict:
        """What one rank's environment holds: ours, torchrun's whole set (so
        ``torch.distributed.is_torchelastic_launched()`` is True and frameworks that detect
        torchrun see it), and DeepSpeed's launch.py names."""
        plan, node = self.plan, self.node
        local_ranks = len(node["ranks"]) or self._warm_count()
        env = dict(os.environ)
        env.update(plan.env)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(plan.world_size),
            LOCAL_WORLD_SIZE=str(local_ranks),
            NODE_RANK=str(self.node_rank),
            MASTER_ADDR=str(plan.master_addr),
            MASTER_PORT=str(plan.master_port),
            DSLAUNCH_RESTART_COUNT=str(self.restart_count),
            PYTHONUNBUFFERED="1",  # lines reach the launcher as they are printed
            # torchrun's: one role ("default") holding every rank, one group per node
            GROUP_RANK=str(self.node_rank),
            GROUP_WORLD_SIZE=str(len(plan.nodes)),
            ROLE_NAME="default",
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(plan.world_size),
            TORCHELASTIC_RUN_ID=plan.run_id or "none",
            TORCHELASTIC_RESTART_COUNT=str(self.restart_count),
            TORCHELASTIC_MAX_RESTARTS=str(plan.max_restarts),
            TORCHELASTIC_ERROR_FILE=torch_error_file,
            # torchrun says True: there its agent hosts the store. Ours hosts none, so rank 0's
            # init_process_group must create it (False), as with a hand-set MASTER_ADDR/PORT.
            TORCHELASTIC_USE_AGENT_STORE="False",
            TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP",  # what this agent handles
            # DeepSpeed's launch.py's
            LOCAL_SIZE=str(local_ranks),
            CROSS_RANK=str(self.node_rank),
            CROSS_SIZE=str(len(plan.nodes)),
        )
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default, kept if set
        if plan.config is not None:
            env["DSLAUNCH_CONFIG"] = plan.config
        if plan.config_path:
            env["DSLAUNCH_CONFIG_PATH"] = plan.config_path
        if plan.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(plan.omp_threads)
        elif cores:
            env["OMP_NUM_THREADS"] = str(len(cores))  # one thread per core of its share
        elif "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, usable_cores() // max(1, local_ranks)))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in node["slots"])
        env[progress_record.ENV] = self.progress_file(rank)
        env[STACK_FILE_ENV] = self.stack_file(rank)
        if plan.recover == "in-process":
            env[recover_files.FILE_ENV] = self.recover_file(local_rank)
        return env

    def recover_file(self, local_rank: int) -> str:
        return os.path.join(self.tmpdir, f"recover_{local_rank}.json")

    def progress_file(self, rank: int) -> str:
        return os.path.join(self.tmpdir, f"progress_{rank}.bin")

    def stack_file(self, rank: int) -> str:
        return os.path.join(self.tmpdir, f"stacks_{rank}.txt")

    def dump_stacks(self, wanted: set) -> None:
        """Send the stacks of this node's running ranks in ``wanted`` (all when empty): Python's,
        then native ones (slower: in an event of their own) when py-spy is installed
        (``agent_diagnostics.py``)."""
        ranks = [r for r in self.ranks if r.proc.poll() is None and (not wanted or r.rank in wanted)]
        self.event(events.STACKS, stacks=diagnostics.python_stacks(ranks))
        native = diagnostics.native_stacks(ranks)
        if native is not None:
            self.event(events.STACKS, stacks=native)

    def start(self) -> None:
        self.gpus = detect_gpus()
        cwd = self.plan.cwd or None
        if cwd and not os.path.isdir(cwd):
            raise RuntimeError(f"working directory {cwd} does not exist on {self.host}")
        for local_rank, rank in enumerate(self.node["ranks"]):
            self._start_rank(rank, local_rank, self._join_env(rank, local_rank))
        self.event(events.STARTED, pids={str(r.rank): r.proc.pid for r in self.ranks},
                   gpus=",".join(map(str, self.node["slots"])) if self.gpus else None)

    def _start_rank(self, rank: int, local_rank: int, extra_env: dict | None = None,
                    standby: bool = False) -> Rank:
        """Start rank ``rank``; with ``standby``, a process that runs the script up to dslaunch's
        first call and waits there to be promoted to a lost rank (``_promote``)."""
        name = f"standby{self.standbys}" if standby else str(rank)
        error_file = os.path.join(self.tmpdir, f"error_{name}.json")
        # torch's @record writes its own format to its own file (errors.read_rank_error)
        torch_error_file = os.path.join(self.tmpdir, f"torchelastic_error_{name}.json")
        for stale in (error_file, torch_error_file):  # a replaced rank's, from its first life
            if os.path.exists(stale):
                os.unlink(stale)
        argv = [sys.executable, "-u", "-m", "dslaunch.launcher.bootstrap", "--error-file", error_file]
        cores = None
        if self.plan.bind_cores:
            try:
                cores = rank_cores(local_rank, len(self.node["ranks"]), self.plan.bind_core_list)
            except CoreListError as exc:
                raise RuntimeError(str(exc)) from None
            argv += ["--cpus", format_cores(cores)]
        env = self.rank_env(rank, local_rank, self.gpus, torch_error_file, cores)
        progress_file, stack_file = self.progress_file(rank), self.stack_file(rank)
        if standby:
            progress_file = os.path.join(self.tmpdir, f"progress_{name}.bin")
            stack_file = os.path.join(self.tmpdir, f"stacks_{name}.txt")
            for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "ROLE_RANK", recover_files.FILE_ENV,
                        progress_record.ENV):  # unknown until promoted
                env.pop(key, None)
            env[STACK_FILE_ENV] = stack_file
            env[recover_files.STANDBY_ENV] = self.standby_file(name)
        else:  # (only ever set by this agent, for its standby)
            env.pop(recover_files.STANDBY_ENV, None)
        env.update(extra_env or {})
        proc = subprocess.Popen(
            [*argv, *self.plan.rank_program(local_rank)],
            env=env,
            cwd=self.plan.cwd or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one pipe: stdout and stderr stay in order per rank
            start_new_session=True,  # own process group: killpg reaches its children too
        )
        r = Rank(-1 if standby else rank, local_rank, proc, error_file, torch_error_file,
                 progress_file, stack_file)
        r.reader = threading.Thread(target=self._read_rank, args=(r,), daemon=True)
        r.reader.start()
        if standby:
            self.standbys += 1
            r.standby_file, r.launch_env = self.standby_file(name), env
            return r
        self.ranks.append(r)
        threading.Thread(target=self._wait_rank, args=(r,), daemon=True).start()
        return r

    def standby_file(self, name: str) -> str:
        return os.path.join(self.tmpdir, f"promote_{name}.json")

    def _read_rank(self, r: Rank) -> None:
        prefixes: dict = {}
        for line in iter(lambda: r.proc.stdout.readline(65536), b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            r.tail.append(line.decode("utf-8", "replace").rstrip("\n"))
            prefix = prefixes.get(r.rank)
            if prefix is None:  # a standby (rank -1) says so until it is promoted
                prefix = prefixes[r.rank] = (self.plan.prefix(r.rank, self.host) if r.rank >= 0
                                             else f"[standby {self.host}] ").encode()
            self.write(prefix + line)

    def _wait_rank(self, r: Rank) -> None:
        rc = r.proc.wait()
        exited_at = time.time()
        r.reader.join(READER_JOIN)  # its last lines go out before its exit event
        self.queue.put(("exit", (r, rc, exited_at)))

    # ---- stopping ------------------------------------------------------------------------------
    def stop(self, dump: bool, kill: bool = False) -> None:
        with self.stop_lock:
            if self.stop_time is None:
                self.stop_time = time.time()
            self.stopping.set()
            if kill:
                self.escalate.set()
            if self.stopper is None:
                self.stopper = threading.Thread(target=self._stop, args=(dump,), daemon=True)
                self.stopper.start()

    def _alive(self) -> list:
        return [r for r in self.ranks if r.proc.poll() is None]

    def _signal_groups(self, sig: int, ranks) -> None:
        for r in ranks:
            try:
                os.killpg(r.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self, dump: bool) -> None:
        self._signal_groups(signal.SIGKILL, self.standby_pool)
        alive = self._alive()
        if dump and alive and not self.escalate.is_set():
            for r in alive:  # the rank itself only: its children may not handle SIGUSR1
                try:
                    os.kill(r.proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            self.escalate.wait(DUMP_WAIT)
        if not self.escalate.is_set():
            self._signal_groups(signal.SIGTERM, self._alive())
            deadline = time.monotonic() + self.plan.grace_period
            while self._alive() and not self.escalate.is_set() and time.monotonic() < deadline:
                self.escalate.wait(0.05)
        self._signal_groups(signal.SIGKILL, self._alive())

    # ---- main loop -----------------------------------------------------------------------------
    def _read_stdin(self) -> None:
        for raw in sys.stdin.buffer:
            self.heard_at = time.monotonic()
            self.queue.put(("command", raw.decode("utf-8", "replace").strip()))
        self.queue.put(("command", "eof"))

    def _heartbeat(self) -> None:
        while not self.all_exited.wait(self.plan.heartbeat_interval):
            progress, idle = diagnostics.progress(self.ranks)
            # in-process recovery: a port free on this host now, for a new group's store here
            # (the launcher cannot ask a remote host at the moment of a fault)
            extra = {"free_port": free_port()} if self.plan.recover == "in-process" else {}
            self.event(events.HEARTBEAT, time=time.time(), progress=progress, idle=idle,
                       rss=diagnostics.memory(self.ranks), **extra)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signal.Signals(signum).name

    def _exit_event(self, r: Rank, rc: int, exited_at: float) -> None:
        error = errors.read_rank_error(r.error_file, TAIL_LINES, r.torch_error_file)
        failed_at = errors.failure_time(error, exited_at)
        self.event(events.EXIT, rank=r.rank, local_rank=r.local_rank, returncode=rc,
                   signal=events.signal_name(rc), time=failed_at,
                   stopped=errors.caused_by_stop(failed_at, self.stop_time),
                   error=error, output_tail=list(r.tail),
                   progress=progress_record.read(r.progress_file))  # its last steps

    def receive_env(self) -> None:
        """Take the job's environment from the private channel the plan names (plan.py)."""
        channel = self.plan.env_channel
        if channel == "environ":
            text = os.environ.pop(ENV_VAR, None)  # popped: the ranks must not inherit the blob
            if text is None:
                raise RuntimeError(f"{ENV_VAR} is not set: the launcher's environment did not "
                                   "reach this agent")
        elif channel == "stdin":
            line = sys.stdin.buffer.readline().decode("ascii", "replace")
            word, _, text = line.partition(" ")
            if word != ENV_LINE:
                raise RuntimeError("the launcher sent no environment (the connection closed "
                                   "first)" if not line else f"expected the environment, got {word!r}")
        else:
            return
        try:
            self.plan.env = decode_env(text)
        except ValueError as exc:
            raise RuntimeError(f"unreadable environment from the launcher: {exc}") from None

    def run(self) -> int:
        try:
            return self._run()
        finally:  # every way out, the early ones too (no environment, ranks that cannot start)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            # every rank is reaped: drop the node lock's file (a next agent already waiting holds
            # it open and gets the lock when this process exits and the kernel releases it)
            if getattr(self, "_node_lock_path", None):
                try:
                    os.unlink(self._node_lock_path)
                except OSError:
                    pass

    def _await_previous_attempt(self) -> None:
        """Start no rank while this node's agent of the previous attempt still stops its ranks
        (node_lock). Uncontended on a first attempt and after ssh/local stops, which end only
        once the agents are done."""
        path = self._node_lock_path = node_lock_path(self.plan, self.node_rank)
        wait = self.plan.grace_period + PREVIOUS_ATTEMPT_WAIT
        self._node_lock_fd, waited, got = node_lock(path, wait, on_wait=lambda: self.say(
            "waiting for the previous attempt's ranks on this host to stop before starting "
            "this attempt's"))
        if not got:
            self.say(f"the previous attempt's agent on this host still runs after {waited:.0f} s; "
                     "starting this attempt's ranks anyway")
        elif waited > 0.5:
            self.say(f"the previous attempt's ranks stopped after {waited:.1f} s; starting")

    def _run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            self.receive_env()  # before the stdin reader thread: the first line is the environment
        except (OSError, RuntimeError) as exc:
            self.event(events.ERROR, message=f"cannot start ranks on {self.host}: {exc}")
            return 2
        self.heard_at = time.monotonic()
        threading.Thread(target=self._read_stdin, daemon=True).start()
        # Heartbeats from the start: GPU detection (nvidia-smi) alone can take seconds.
        threading.Thread(target=self._heartbeat, daemon=True).start()
        if not self.warm:  # (a warm spare has no node of its own to lock)
            self._await_previous_attempt()  # heartbeats go on meanwhile: the launcher sees us alive
        try:
            self.start()
        except (OSError, RuntimeError) as exc:
            self.event(events.ERROR, message=f"cannot start ranks on {self.host}: {exc}")
            self.stop(dump=False, kill=True)
            self._reap_all()
            return 2
        self._start_standby(self._warm_count() if self.warm else 1)
        faults = inject.HostFaults.from_env(self, {**os.environ, **self.plan.env})
        if faults is not None:
            faults.start()
        returncodes: dict = {}  # index in self.ranks -> exit code (a replacement is a new entry)
        while len(returncodes) < len(self.ranks) or self.awaiting_word or self.warm:
            if self.silent:
                break
            if self.signalled:
                self.signalled = None
                self.stop(dump=False)
            self._fence()
            self._forward_acks()
            try:
                kind, item = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "exit":
                r, rc, exited_at = item
                returncodes[self.ranks.index(r)] = rc
                self._exit_event(r, rc, exited_at)
                if rc != 0 and not self.stopping.is_set():
                    if self.plan.recover == "in-process" and rc != recover_files.REFUSED_EXIT:
                        self.awaiting_word = True  # the launcher decides: recover or stop
                    else:
                        self.stop(dump=True)  # fail fast on this node
                continue
            if item in (events.CMD_KILL, events.CMD_STOP_FAILURE, events.CMD_STOP, "eof") \
                    or item.startswith(events.CMD_RECOVER):
                self.awaiting_word = False  # the launcher's word after a failed rank
                if not item.startswith(events.CMD_RECOVER):
                    self.warm = False  # a warm spare the job ends without: its loop ends too
            if item == events.CMD_KILL:
                self.stop(dump=False, kill=True)
            elif item == events.CMD_STOP_FAILURE:
                self.stop(dump=True)
            elif item in (events.CMD_STOP, "eof"):
                self.stop(dump=False)
            elif item.startswith(events.CMD_DUMP_STACKS):
                wanted = {int(w) for w in item[len(events.CMD_DUMP_STACKS):].split() if w.isdigit()}
                threading.Thread(target=self.dump_stacks, args=(wanted,), daemon=True).start()
            elif item.startswith(events.CMD_RECOVER):
                self._recover(item[len(events.CMD_RECOVER):].strip())
            elif item.startswith(events.CMD_ADOPT):
                self._adopt(item[len(events.CMD_ADOPT):].strip())
            elif item.startswith(events.CMD_KILL_RANKS):
                wanted = {int(w) for w in item[len(events.CMD_KILL_RANKS):].split() if w.isdigit()}
                self._signal_groups(signal.SIGKILL, [r for r in self._alive() if r.rank in wanted])
        returncodes = {str(r.rank): returncodes[i] for i, r in enumerate(self.ranks)
                       if i in returncodes}  # a replaced rank: its replacement's code
        if self.silent:
            self._play_dead()
        self.all_exited.set()
        self._reap_all()
        self.event(events.DONE, returncodes=returncodes)
        return 0 if all(rc == 0 for rc in returncodes.values()) else 1

    def _fence(self) -> None:
        """Cut off from the launcher for ``fence_timeout`` s: kill this node's ranks (the
        launcher, which stopped hearing us too, restarts the job without this host)."""
        timeout = self.plan.fence_timeout
        if timeout <= 0 or self.stopping.is_set():
            return
        silent = time.monotonic() - self.heard_at
        if silent > timeout:
            self.say(f"fencing: no word from the launcher for {silent:.1f} s (limit "
                     f"{timeout:g} s); killing this host's ranks")
            self.stop(dump=False, kill=True)

    def _reap_all(self) -> None:
        # A rank's leftover children (same process group) must not outlive the job.
        self._signal_groups(signal.SIGKILL, self.ranks + self.standby_pool)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dslaunch.launcher.agent")
    p.add_argument("--plan", required=True, help="base64 WorldPlan (WorldPlan.encode())")
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--restart-count", type=int, default=0)
    p.add_argument("--join", default=None,
                   help="JSON recover word: the ranks start as in-process replacements")
    p.add_argument("--warm-spare", default=None, metavar="JSON",
                   help='{"host": H, "slots": [...]}: this spare host\'s standbys only, until '
                        "the launcher gives it a node")
    args = p.parse_args(argv)
    try:
        plan = WorldPlan.decode(args.plan)
        warm = json.loads(args.warm_spare) if args.warm_spare else None
        if warm is None:
            plan.node(args.node_rank)
        join = json.loads(args.join) if args.join else None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        sys.stderr.write(f"dslaunch agent: bad plan, node rank or join word: {exc}\n")
        return 2
    node_rank = None if warm is not None else args.node_rank
    return Agent(plan, node_rank, args.restart_count, join=join, warm_spare=warm).run()


if __name__ == "__main__":
    code = main()
    try:
        sys.stdout.flush()
    except OSError:
        pass
    # Skip interpreter shutdown: the stdin reader thread may be blocked in read(), and finalising
    # would abort on its buffer lock. Every rank has been reaped by now.
    os._exit(code)
