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
ranks start again as replacements: ``_recover``) or a stop. No torch here: starting ranks must
stay cheap.
"""

from __future__ import annotations

import argparse
import collections
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
from dslaunch.launcher import errors, events, inject
from dslaunch.launcher.bootstrap import STACK_FILE_ENV
from dslaunch.launcher.cores import CoreListError, format_cores, rank_cores
from dslaunch.launcher.idleness import Idleness, cpu_ticks
from dslaunch.launcher.plan import ENV_LINE, ENV_VAR, WorldPlan, decode_env, free_port

TAIL_LINES = 20
DUMP_WAIT = 0.5  # seconds between the SIGUSR1 stack dump and SIGTERM (the dump is written at once)
STACK_WAIT = 1.5  # how long a "dump stacks" waits for a rank's faulthandler file (a busy host may
# take a while to schedule the rank that must handle the signal)
PYSPY_TIMEOUT = 1.5
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


class Rank:
    def __init__(self, rank: int, local_rank: int, proc: subprocess.Popen, error_file: str,
                 torch_error_file: str = "", progress_file: str = "", stack_file: str = ""):
        self.rank, self.local_rank, self.proc, self.error_file = rank, local_rank, proc, error_file
        self.torch_error_file = torch_error_file
        # where its progress record and stack dumps go (a promoted standby keeps its stack file)
        self.progress_file, self.stack_file = progress_file, stack_file
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.reader: threading.Thread | None = None
        self.exited = False
        self.idleness = Idleness(time.monotonic())  # the hang watchdog's input (idleness.py)


def node_lock_path(plan: WorldPlan, node_rank: int) -> str:
    """The file an agent holds locked while it lives, one per (job, host, node): the agent of the
    next attempt of the same node takes it before starting ranks."""
    import hashlib

    key = f"{plan.run_id}|{plan.node(node_rank)['host']}|{node_rank}|{plan.master_port}"
    name = hashlib.sha1(key.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"dslaunch-node-{name}.lock")


def node_lock(path: str, wait: float, on_wait=None):
    """Lock ``path`` (flock, released by the kernel when this process ends, even by SIGKILL).
    A restart must not start ranks on a node while the previous attempt's ranks there still run:
    with pdsh the launcher's stop closes the connections and the attempt is over for the
    launcher at once, while each remote agent is still stopping its ranks (EOF on stdin ->
    SIGTERM, grace period, SIGKILL), so the next attempt's rank 0 met the old rank 0 still
    holding MASTER_PORT (or the old store answering the new ranks). The old agent exits only
    after its ranks are gone, so holding its lock means they are. Returns (fd, seconds waited,
    got it); after ``wait`` s it gives up waiting and returns got=False (the caller goes on)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    start = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, time.monotonic() - start, True
        except BlockingIOError:
            pass
        if not told and on_wait is not None:
            on_wait()
            told = True
        if time.monotonic() - start > wait:
            return fd, time.monotonic() - start, False
        time.sleep(0.05)


class Agent:
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

    def progress(self) -> tuple:
        """({rank: its last progress record} for the running ranks that wrote one, {rank: seconds
        without progress (idleness.py)} for every running rank)."""
        found, idle = {}, {}
        now, wall = time.monotonic(), time.time()
        for r in self.ranks:
            if r.proc.poll() is None:
                rec = progress_record.read(r.progress_file)
                if rec is not None:
                    found[str(r.rank)] = rec
                idle[str(r.rank)] = r.idleness.update(rec, cpu_ticks(r.proc.pid), now, wall)
        return found, idle

    def dump_stacks(self, wanted: set) -> None:
        """Send the stacks of this node's running ranks in ``wanted`` (all when empty): the
        bootstrap's faulthandler appends them to the rank's stack file on SIGUSR2."""
        ranks = [r for r in self.ranks if r.proc.poll() is None and (not wanted or r.rank in wanted)]
        sizes = {}
        for r in ranks:
            try:
                sizes[r.rank] = os.path.getsize(r.stack_file)
            except OSError:
                sizes[r.rank] = 0
            try:
                os.kill(r.proc.pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        stacks = {str(r.rank): {"python": _read_new(r.stack_file, sizes[r.rank])}
                  for r in ranks}
        self.event(events.STACKS, stacks=stacks)
        if ranks and shutil.which("py-spy"):  # slower: in an event of their own, after these
            self.event(events.STACKS, stacks={str(r.rank): {"native": _pyspy(r.proc.pid)}
                                              for r in ranks})

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

    def memory(self) -> dict:
        """{rank: resident memory in bytes} of the running ranks (the live job view's column)."""
        import psutil  # here, not at import: starting ranks must stay cheap

        rss = {}
        for r in self.ranks:
            if r.proc.poll() is None:
                try:
                    value = psutil.Process(r.proc.pid).memory_info().rss
                except (psutil.Error, OSError):
                    continue
                if value:  # 0: exited, not yet reaped (a zombie): no figure
                    rss[str(r.rank)] = value
        return rss

    def _heartbeat(self) -> None:
        while not self.all_exited.wait(self.plan.heartbeat_interval):
            progress, idle = self.progress()
            # in-process recovery: a port free on this host now, for a new group's store here
            # (the launcher cannot ask a remote host at the moment of a fault)
            extra = {"free_port": free_port()} if self.plan.recover == "in-process" else {}
            self.event(events.HEARTBEAT, time=time.time(), progress=progress, idle=idle,
                       rss=self.memory(), **extra)

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

    # ---- in-process recovery (engine/recovery/ has the ranks' side) ----------------
    def _recover(self, text: str) -> None:
        """The launcher's ``recover`` word: each running rank of ours gets it in its instruction
        file (it aborts its collectives and joins the new group); each rank of ours it lists
        under ``replace`` starts again as a new process that joins the survivors."""
        try:
            word = json.loads(text)
        except ValueError:
            self.event(events.ERROR, message=f"unreadable recover word: {text[:200]}")
            return
        epoch = int(word["epoch"])
        renumber = word.get("renumber")  # a lost host: the others go on as a smaller world
        if renumber:
            self.node["ranks"] = [renumber.get(str(r), r) for r in self.node["ranks"]]
            self.plan.world_size = int(word["world_size"])
        for r in self._alive():
            if renumber:
                r.rank = renumber.get(str(r.rank), r.rank)
            path = self.recover_file(r.local_rank)
            self.pending_acks[r.local_rank] = (r.rank, epoch)
            recover_files.write_json(path, {**word, "rank": r.rank})
        self._start_replacements(word)

    def _adopt(self, text: str) -> None:
        """A warm spare becomes the agent of a lost host's node (``adopt {"node_rank": n, "word":
        recover word}``): that node's ranks start here from the standbys already waiting, as
        replacements that join the survivors."""
        try:
            msg = json.loads(text)
            n, word = int(msg["node_rank"]), msg["word"]
            node = self.plan.node(n)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.event(events.ERROR, message=f"unreadable adopt word: {exc}: {text[:200]}")
            return
        slots = self.node["slots"]
        node["host"], node["slots"] = self.host, slots[:len(node["ranks"])]
        self.node, self.node_rank, self.warm = node, n, False
        self.say(f"taking over node {n} (ranks {', '.join(map(str, node['ranks']))}) from its "
                 f"{len(self.standby_pool)} warm standby process(es)")
        self._start_replacements(word)

    def _start_replacements(self, word: dict) -> None:
        """Each rank of ours the recover ``word`` lists under ``replace`` starts again as a new
        process (a standby promoted when one waits) that joins the survivors."""
        epoch = int(word["epoch"])
        for new in word.get("replace", []):
            if int(new["node_rank"]) != self.node_rank:
                continue
            local_rank, rank = int(new["local_rank"]), int(new["rank"])
            path = self.recover_file(local_rank)
            for stale in (path, recover_files.ack_path(path)):
                if os.path.exists(stale):
                    os.unlink(stale)
            extra = self._replacement_env(word, rank, local_rank)
            try:
                r = self._promote(rank, local_rank, extra) or self._start_rank(rank, local_rank, extra)
            except (OSError, RuntimeError) as exc:
                self.event(events.RECOVER_ACK, rank=rank, epoch=epoch, status="refused",
                           why=f"cannot start the replacement on {self.host}: {exc}")
                continue
            self.event(events.STARTED, pids={str(rank): r.proc.pid}, replacement=True)

    def _join_env(self, rank: int, local_rank: int) -> dict | None:
        """At start, with ``self.join`` (a spare host taking a lost host's ranks): each rank is a
        replacement. None: an ordinary start."""
        return None if self.join is None else self._replacement_env(self.join, rank, local_rank)

    def _replacement_env(self, word: dict, rank: int, local_rank: int) -> dict:
        """The extra environment of a replacement for ``rank`` under the recover ``word``; its
        answer will be forwarded like a survivor's."""
        epoch = int(word["epoch"])
        self.pending_acks[local_rank] = (rank, epoch)
        return {recover_files.JOIN_ENV: json.dumps({**word, "rank": rank}),
                # --inject faults are per attempt: the replacement must not meet its own again
                "DSLAUNCH_RESTART_COUNT": str(self.restart_count + epoch)}

    def _warm_count(self) -> int:
        """A warm spare's standbys: enough for the largest node's ranks, within its slots."""
        if not self.warm:
            return 0
        return max(1, min(len(self.node["slots"]) or 1,
                          max(len(n["ranks"]) for n in self.plan.nodes)))

    def _start_standby(self, count: int = 1) -> None:
        """With in-process recovery, warm processes (one per node, ``count`` on a warm spare;
        DSLAUNCH_RECOVER_STANDBY=0: none): a lost rank is replaced without a process start, torch
        import and model build on the recovery's path."""
        if self.plan.recover != "in-process" or self.stopping.is_set() or \
                recover_files.standbys_off(self.plan.env):
            return
        for _ in range(count):
            try:
                self.standby_pool.append(self._start_rank(-1, 0, standby=True))
            except (OSError, RuntimeError) as exc:
                self.say(f"no standby process for in-process recovery: {exc}")
                return

    def _promote(self, rank: int, local_rank: int, extra: dict) -> Rank | None:
        """A standby becomes ``rank`` (None: there is none alive)."""
        while self.standby_pool and self.standby_pool[0].proc.poll() is not None:
            self.standby_pool.pop(0)  # (one that died waiting)
        if not self.standby_pool:
            return None
        r = self.standby_pool.pop(0)
        env = self.rank_env(rank, local_rank, self.gpus)
        env.update(extra)
        env.pop(STACK_FILE_ENV, None)  # its faulthandler already writes to its own file
        delta = {k: v for k, v in env.items() if r.launch_env.get(k) != v}
        r.rank, r.local_rank, r.progress_file = rank, local_rank, self.progress_file(rank)
        r.idleness = Idleness(time.monotonic())
        recover_files.write_json(r.standby_file, {"env": delta})
        self.ranks.append(r)
        threading.Thread(target=self._wait_rank, args=(r,), daemon=True).start()
        return r

    def _forward_acks(self) -> None:
        """Send on what the ranks answered to a recover word (their ack files)."""
        for local_rank, (rank, epoch) in list(self.pending_acks.items()):
            ack = recover_files.read_json(recover_files.ack_path(self.recover_file(local_rank)))
            if ack is None or ack.get("epoch") not in (epoch, 0):
                continue
            if ack.get("status") == "recovering":  # under way: the final answer follows
                if self.started_acks.get(local_rank) != epoch:
                    self.started_acks[local_rank] = epoch
                    self.event(events.RECOVER_ACK, rank=rank, **{**ack, "epoch": epoch})
                continue
            del self.pending_acks[local_rank]
            self.event(events.RECOVER_ACK, rank=rank, **{**ack, "epoch": epoch})
            if ack.get("status") == "joined" and not self.standby_pool:
                self._start_standby()  # for the next fault, once this one is over (CPU)

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


def _read_new(path: str, start: int) -> str:
    """What a rank's faulthandler appended to ``path`` after byte ``start``: waits until the file
    has grown and then stays the same for a moment (the dump is written in pieces), at most
    STACK_WAIT seconds."""
    deadline = time.monotonic() + STACK_WAIT
    last = start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if size > start and size == last:
            break
        last = size
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(256 * 1024).decode("utf-8", "replace")
    except OSError:
        return ""


def _pyspy(pid: int) -> str | None:
    """``py-spy dump --native`` of the rank when py-spy is installed (not a dependency)."""
    exe = shutil.which("py-spy")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=PYSPY_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy failed: {exc}"
    return out.stdout if out.returncode == 0 else f"py-spy failed: {out.stderr.strip()[-300:]}"


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
