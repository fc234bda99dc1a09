"""Process-group set-up and the accounting of every collective the runtime makes.

``init_distributed`` learns the rank layout from the environment only (the launcher's torchrun
names, else MPI's or SLURM's), so a script runs the same under dslaunch, torchrun, srun or mpirun.
A single process with no launcher variables gets a one-rank group over an in-memory store
(no network, no port), so the rest of the runtime never special-cases "not distributed".

On a GPU machine the NCCL group is made as ``cpu:gloo,cuda:nccl``: CUDA tensors go over NCCL and
CPU tensors (an offloaded optimizer's pieces, the fp64 norm/overflow scalars, checkpoint metadata)
over gloo, instead of every such call site copying to the GPU and back. ``group_backend`` says
which backend a tensor on a device meets in a group.

``Comm`` wraps the collectives the engine and the ZeRO strategies use and counts, per collective,
the calls, the payload bytes (the size of the tensor handed to the collective on this rank — what
the caller asked to move, not the algorithm's wire bytes) and the seconds this rank spent from the
call until the result was ready (for an async call: until ``wait()`` returned).

``sent_bytes`` (beside ``bytes``) is what this rank sends to the other ranks: the bytes the
collective must move across the network in total, divided by the ranks (what each rank sends with
the ring / pairwise algorithms gloo and NCCL use), so that different collectives compare honestly:
all_reduce ``2(N-1)/N x payload``, all_gather ``(N-1) x input``, reduce_scatter, all_to_all,
broadcast, reduce, gather and scatter ``(N-1)/N x payload`` (for gather and scatter the payload is
this rank's piece), send the payload (recv 0: its sender counts it); 0 with one rank and for
object/barrier collectives.

``link`` (set once the hosts are known, ``host_groups.py``): ``"intra_host"`` for a group on one
host, ``"inter_host"`` for one that crosses hosts; each record then also counts its calls, bytes
and sent_bytes under ``links[link]``, so the stats say how much went over groups that cross hosts.
On the hierarchical path (below) a call's sent_bytes are split between the two by where its
pieces went: (H - 1) of every N - 1 cross hosts.

On gloo, ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` need not run as gloo's own
collectives, which move each byte several times slower than its all_reduce over TCP
(``benchmarks/bench_collectives.py``). Other paths compute the same result:

- ``pairwise`` (``comm_pairwise.py``): every rank exchanges its pieces with every other rank by
  isend/irecv, all posted at once; the same bytes as the ring algorithms;
- ``hierarchical`` (``comm_hier.py``): the pairwise exchange over a group that spans hosts with
  several ranks on each (``hosts``, set with ``link``): each piece crosses to each other host
  once and is passed on over that host's loopback; the same bytes per rank, fewer across hosts;
- ``all_reduce``: the reduce-scatter all-reduces the input bucket and copies this rank's chunk
  out; the all-gather zero-fills the output except this rank's chunk and all-reduces it (exact:
  ``x + 0 == x`` for every finite value, inf and NaN; only a ``-0.0`` comes back as ``+0.0``).
  Twice the bytes of the pairwise path, kept as the measured baseline.

``DSLAUNCH_GLOO_COLLECTIVES`` chooses: ``native``, ``pairwise``, ``allreduce`` or ``auto``
(default: the measured fastest per collective, ``GLOO_AUTO``; ``pairwise`` goes hierarchical
where the group knows its hosts). NCCL (and any other backend)
always runs the native collectives. A call is booked under its own name (``reduce_scatter`` /
``all_gather``) with its ``path``; on the all_reduce path ``sent_bytes`` is that of the all_reduce
it ran (``2(N-1)/N x`` the whole buffer).
"""

from __future__ import annotations

import atexit
import datetime
import os
import time
import zlib
from collections import defaultdict

import torch
import torch.distributed as dist

from dslaunch import progress_record
from dslaunch.engine.comm import hierarchical as comm_hier
from dslaunch.engine.comm import pairwise as comm_pairwise
from dslaunch.engine.comm.hierarchical import INTER, INTRA
from dslaunch.engine.comm.membership import await_promotion, init_private_world, join_word
from dslaunch.engine.observe.comms_logger import COMMS_LOGGER
from dslaunch.engine.observe.comms_logger import configure as configure_comms_logger

# torch 2.13 renamed the flat collectives (the old names warn, FutureWarning); older torch has only
# the old names. Same signatures.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# (rank, world size, local rank) spellings, most specific first.
_ENV_LAYOUTS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # dslaunch, torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH / Intel MPI (hydra)
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),  # srun
)


def env_layout(environ=None) -> tuple[int, int, int, str]:
    """(rank, world_size, local_rank, source) read from the environment; (0, 1, 0, "none") when no
    launcher variables are set."""
    env = os.environ if environ is None else environ
    for rank_name, size_name, local_name in _ENV_LAYOUTS:
        if rank_name in env and size_name in env:
            rank, size = int(env[rank_name]), int(env[size_name])
            local = int(env.get(local_name, env.get("LOCAL_RANK", rank)))
            return rank, size, local, rank_name
    return 0, 1, 0, "none"


def default_backend() -> str:
    from dslaunch.accelerator import get_accelerator

    return get_accelerator().communication_backend_name()


def with_cpu_backend(backend: str) -> str:
    """NCCL carries only CUDA tensors: pair it with gloo for CPU ones (torch's per-device form)."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" and torch.cuda.is_available() else backend


def group_backend(backend: str | None, device_type: str) -> str | None:
    """The backend a ``device_type`` tensor meets in a group made with ``backend`` (which may be
    torch's per-device form, ``cpu:gloo,cuda:nccl``)."""
    if backend is None or ":" not in backend:
        return backend
    pairs = dict(part.split(":", 1) for part in backend.split(","))
    return pairs.get(device_type)


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = False,
                     timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                     init_method: str | None = None, dist_init_required: bool | None = None,
                     config=None, rank: int = -1, world_size: int = -1) -> None:
    """Initialise torch.distributed once (DeepSpeed's signature). Does nothing if already done.
    ``config`` (a config dict): its ``comms_logger`` section switches the comms logger, as
    DeepSpeed's (the byte accounting below is always on)."""
    await_promotion()  # a standby process: until it replaces a lost rank (before any group)
    if isinstance(config, dict) and config.get("comms_logger") is not None:
        configure_comms_logger(config)
    if dist.is_initialized():
        return
    if dist_init_required is False:
        return
    if join_word():  # a replacement rank: builds alone first, then joins the survivors' group
        init_private_world()
        return
    env_rank, env_size, local, source = env_layout()
    rank = env_rank if rank < 0 else rank
    world_size = env_size if world_size < 0 else world_size
    backend = with_cpu_backend(dist_backend or default_backend())
    if source not in ("RANK", "none") and auto_mpi_discovery:
        # Other launchers: give torch the names env:// reads.
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world_size))
        os.environ.setdefault("LOCAL_RANK", str(local))
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        if "MASTER_ADDR" not in os.environ and world_size > 1:
            raise RuntimeError(
                f"launched by {source} with {world_size} ranks but MASTER_ADDR is not set: export "
                "MASTER_ADDR (the first host's address) so the ranks can meet")
    if world_size == 1 and init_method is None and "MASTER_ADDR" not in os.environ:
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    else:
        if "MASTER_ADDR" not in os.environ and init_method is None:
            raise RuntimeError(f"WORLD_SIZE={world_size} but MASTER_ADDR is not set; start the "
                               "script with `dslaunch run` (or torchrun / srun / mpirun)")
        if torch.cuda.is_available() and "nccl" in backend:
            torch.cuda.set_device(local)
        dist.init_process_group(backend, init_method=init_method or "env://", rank=rank,
                                world_size=world_size, timeout=timeout)
    # Tear the group down before interpreter shutdown: gloo's threads outliving the Python
    # objects they serve made ranks abort at exit ("terminate called without an active exception").
    atexit.register(_destroy_at_exit)
    if verbose and rank == 0:
        print(f"[dslaunch] torch.distributed initialised: backend={backend} world={world_size}",
              flush=True)


def _destroy_at_exit() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # at exit, a failed teardown must not hide the script's own result
            pass


def local_rank() -> int:
    return env_layout()[2]


GLOO_COLLECTIVES_ENV = "DSLAUNCH_GLOO_COLLECTIVES"
# what "auto" picks per collective on gloo (bench_collectives.py, 2 ranks, 2M-element buckets)
GLOO_AUTO = {"reduce_scatter": "pairwise", "all_gather": "pairwise"}
GLOO_PATHS = ("native", "pairwise", "all_reduce")


def collective_paths(backend: str | None, environ=None) -> dict:
    """{"reduce_scatter": path, "all_gather": path}, path "native" or "all_reduce", for a group
    of ``backend``; gloo's choice comes from ``DSLAUNCH_GLOO_COLLECTIVES``."""
    native = {"reduce_scatter": "native", "all_gather": "native"}
    if backend != "gloo":
        return native
    env = os.environ if environ is None else environ
    choice = env.get(GLOO_COLLECTIVES_ENV, "auto").strip().lower() or "auto"
    if choice == "auto":
        return dict(GLOO_AUTO)
    path = "all_reduce" if choice == "allreduce" else choice
    if path in GLOO_PATHS:
        return {"reduce_scatter": path, "all_gather": path}
    raise ValueError(f"{GLOO_COLLECTIVES_ENV}={choice!r}: expected native, pairwise, allreduce "
                     "or auto")


def sent_bytes(collective: str, payload: int, world: int) -> int:
    """Bytes one rank sends for ``payload`` bytes handed to ``collective`` on ``world`` ranks (see
    the module docstring). ``collective`` is matched by its ending ("onebit_all_gather" counts as
    an all_gather)."""
    if world <= 1:
        return 0
    if collective.endswith("all_reduce"):
        return 2 * (world - 1) * payload // world
    if collective.endswith("all_gather"):
        return (world - 1) * payload
    if collective.endswith(("scatter", "all_to_all", "broadcast", "reduce", "gather")):
        return (world - 1) * payload // world
    if collective.endswith("send"):
        return payload
    return 0


P2P_GROUP = "p2p"  # progress label of point-to-point calls: no sequence shared across ranks
_P2P = frozenset(("send", "recv"))


def group_label(group) -> str:
    """A group's name in the progress record, the same on every member (its sequence numbers line
    up across ranks): "world", else "ranks 0-3,8" (global ranks, runs collapsed)."""
    if group is None or group is dist.group.WORLD or not dist.is_initialized():
        return "world"
    try:
        ranks = sorted(dist.get_process_group_ranks(group))
    except (ValueError, RuntimeError):
        return "group"
    runs, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append(str(start) if start == r else f"{start}-{r}")
            start = None
    text = "ranks " + ",".join(runs)
    if len(text) > 48:  # the record's field width: keep the ends and a digest of the rest
        text = f"ranks {ranks[0]}..{ranks[-1]} n{len(ranks)} {zlib.crc32(text.encode()):08x}"
    return text


class _TimedWork:
    """An async collective's handle that books the wait time when it completes (and, with a
    progress writer, shows the rank waiting in it from ``wait()`` until it returns)."""

    def __init__(self, work, record, start, then=None, progress=None, log=None):
        self._work, self._record, self._start = work, record, start
        self._log = log  # (comm, name, nbytes) when the comms logger records this call
        self._then = then  # completes the result once the collective is done (a chunk copy)
        self._progress = progress  # (writer, op, group, seq, nbytes) or None
        self._done = False

    def wait(self):
        if not self._done:
            p = self._progress
            if p is not None:
                p[0].resume(*p[1:])
            self._work.wait()
            if self._then is not None:
                self._then()
                self._then = None
            if self._log is not None:
                comm, name, nbytes = self._log
                comm._log(name, nbytes, self._start)
            self._record["seconds"] += time.perf_counter() - self._start
            self._done = True
            if p is not None:
                p[0].leave()
        return True

    def is_completed(self):
        return self._done or self._work.is_completed()


class Comm:
    """The collectives of one process group (default: the world), with accounting."""

    def __init__(self, group=None):
        self.group = group
        self.rebind()
        self._stats: dict = defaultdict(
            lambda: {"calls": 0, "bytes": 0, "sent_bytes": 0, "seconds": 0.0})
        self._progress = progress_record.writer()  # None unless an agent reads our progress
        self.label = group_label(group)
        # "intra_host" / "inter_host" once the hosts are known (engine/comm/host_groups.py): each
        # record then splits its counts under "links" by that kind of group
        self.link = None
        # the group's ranks by host (comm_hier.HostRanks), set with ``link`` where the group
        # spans hosts with several ranks on each: the pairwise path then goes hierarchical
        self.hosts = None

    def rebind(self) -> None:
        """Read the group's rank, size and backend (again: in-process recovery replaced the world
        under this object, engine/recovery/)."""
        group = self.group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        backend = str(dist.get_backend(group)) if dist.is_initialized() and self.world_size > 1 else None
        self._paths = {dev: collective_paths(group_backend(backend, dev)) for dev in ("cpu", "cuda")}

    def _exchange(self, name: str):
        """The point-to-point form of ``name`` ("all_gather" / "reduce_scatter") on this group:
        hierarchical where it knows its hosts, else flat. (fn(output, input, async_op), path)."""
        if self.hosts is not None:
            fn = getattr(comm_hier, name)
            return (lambda o, i, a: fn(o, i, self.group, self.hosts, a)), "hierarchical"
        fn = getattr(comm_pairwise, name)
        return (lambda o, i, a: fn(o, i, self.group, self.rank, self.world_size, a)), "pairwise"

    def paths_for(self, tensor) -> dict:
        """The collective paths for a tensor on its device (gloo's choices for a CPU tensor)."""
        return self._paths.get(tensor.device.type, self._paths["cuda"])

    # -- accounting ---------------------------------------------------------------------------
    def _book(self, name: str, nbytes: int, path: str | None = None,
              sent_nbytes: int | None = None) -> dict:
        """``path`` (for collectives that may be emulated): "native", "pairwise", "hierarchical"
        or "all_reduce"; for the last, ``sent_nbytes`` is the payload of the all_reduce that ran."""
        rec = self._stats[name]
        if path is None:
            sent = sent_bytes(name, int(nbytes), self.world_size)
        else:
            algo = "all_reduce" if path == "all_reduce" else name
            payload = nbytes if sent_nbytes is None else sent_nbytes
            sent = sent_bytes(algo, int(payload), self.world_size)
            rec["path"] = path if rec.get("path", path) == path else "mixed"
        rec["calls"] += 1
        rec["bytes"] += int(nbytes)
        rec["sent_bytes"] += sent
        if self.link is not None:
            links = rec.setdefault("links", {})
            for link, part in self._split_by_link(sent, path).items():
                book = links.setdefault(link, {"calls": 0, "bytes": 0, "sent_bytes": 0})
                book["calls"] += 1
                book["bytes"] += int(nbytes)
                book["sent_bytes"] += part
        return rec

    def _split_by_link(self, sent: int, path: str | None) -> dict:
        """{link: bytes of ``sent`` that went over it}: all of it over the group's link, except on
        the hierarchical path, where (H - 1) of every N - 1 pieces cross hosts (comm_hier.py)."""
        if path != "hierarchical" or self.hosts is None:
            return {self.link: sent}
        n_hosts = len(self.hosts.hosts)
        across = sent * (n_hosts - 1) // (self.world_size - 1)
        return {INTER: across, INTRA: sent - across}

    def _run(self, name, nbytes, fn, async_op, path=None, sent_nbytes=None, then=None):
        rec = self._book(name, nbytes, path, sent_nbytes)
        w = self._progress
        if w is not None:
            label = P2P_GROUP if name in _P2P else self.label
            seq = w.enter(name, label, nbytes)
        start = time.perf_counter()
        try:
            work = fn(async_op)
        except BaseException:
            if w is not None:
                w.leave()
            raise
        if async_op:
            log = (self, name, nbytes) if COMMS_LOGGER.enabled else None
            if w is None:
                return _TimedWork(work, rec, start, then, log=log)
            w.leave()  # issued: the rank goes on until wait(), which shows it in the call again
            return _TimedWork(work, rec, start, then, (w, name, label, seq, nbytes), log)
        if then is not None:
            then()
        if COMMS_LOGGER.enabled:
            self._log(name, nbytes, start)
        rec["seconds"] += time.perf_counter() - start
        if w is not None:
            w.leave()
        return work  # what the call returns: None for a collective, the sender's rank for recv

    def _log(self, name, nbytes, start) -> None:
        """Hand a completed call to the comms logger, the device synchronised first (a queued
        kernel has not finished when the call returns)."""
        from dslaunch.accelerator import get_accelerator

        get_accelerator().synchronize()
        COMMS_LOGGER.record(name, nbytes, time.perf_counter() - start, self.world_size)

    def stats(self) -> dict:
        """{collective: {"calls", "bytes", "sent_bytes", "seconds"}} since start (or the last
        reset); with the hosts known, also "links": {"intra_host" | "inter_host": {"calls",
        "bytes", "sent_bytes"}}, the same counts split by whether the group crossed hosts."""
        out = {}
        for k, v in self._stats.items():
            out[k] = dict(v)
            if "links" in v:
                out[k]["links"] = {kind: dict(c) for kind, c in v["links"].items()}
        return out

    def reset_stats(self) -> None:
        self._stats.clear()

    # -- collectives --------------------------------------------------------------------------
    @staticmethod
    def _nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, async_op=False):
        return self._run("all_reduce", self._nbytes(tensor),
                         lambda a: dist.all_reduce(tensor, op=op, group=self.group, async_op=a),
                         async_op)

    def broadcast(self, tensor, src=0, async_op=False):
        return self._run("broadcast", self._nbytes(tensor),
                         lambda a: dist.broadcast(tensor, src, group=self.group, async_op=a),
                         async_op)

    def all_gather_into_tensor(self, output, input, async_op=False):
        """``output`` (world x ``input``) gets every rank's ``input``. ``input`` may be this
        rank's chunk of ``output`` itself on the pairwise and all_reduce paths, not on the
        native one."""
        path = self.paths_for(input)["all_gather"]
        if path == "native":
            return self._run("all_gather", self._nbytes(input),
                             lambda a: all_gather_single(output, input, group=self.group,
                                                         async_op=a),
                             async_op, path="native")
        c = input.numel()
        if output.numel() != c * self.world_size or not output.is_contiguous():
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, "
                             f"expected {self.world_size} x {c} contiguous")
        if path == "pairwise":
            exchange, path = self._exchange("all_gather")
            return self._run("all_gather", self._nbytes(input),
                             lambda a: exchange(output, input, a), async_op, path=path)
        flat = output.view(-1)
        lo, hi = self.rank * c, (self.rank + 1) * c
        mine = flat[lo:hi]
        if mine.data_ptr() != input.data_ptr():
            mine.copy_(input.reshape(-1))
        flat[:lo].zero_()
        flat[hi:].zero_()
        return self._run("all_gather", self._nbytes(input),
                         lambda a: dist.all_reduce(flat, group=self.group, async_op=a),
                         async_op, path="all_reduce", sent_nbytes=self._nbytes(output))

    def reduce_scatter_tensor(self, output, input, op=dist.ReduceOp.SUM, async_op=False,
                              input_is_scratch=False):
        """``output`` gets this rank's chunk of the reduction of every rank's ``input``. On the
        all_reduce path the input is reduced in place when the caller says it is scratch
        (``input_is_scratch``: it holds the reduced sums afterwards), else a copy is."""
        path = self.paths_for(input)["reduce_scatter"]
        if path == "native":
            return self._run("reduce_scatter", self._nbytes(input),
                             lambda a: reduce_scatter_single(output, input, op=op,
                                                             group=self.group, async_op=a),
                             async_op, path="native")
        c = output.numel()
        if input.numel() != c * self.world_size:
            raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements, "
                             f"expected {self.world_size} x {c}")
        if path == "pairwise" and op == dist.ReduceOp.SUM:  # other ops: the all_reduce path
            exchange, path = self._exchange("reduce_scatter")
            return self._run("reduce_scatter", self._nbytes(input),
                             lambda a: exchange(output, input, a), async_op, path=path)
        buf = input.reshape(-1) if input_is_scratch and input.is_contiguous() else \
            input.reshape(-1).clone()
        mine = buf[self.rank * c: (self.rank + 1) * c]

        def take():
            output.view(-1).copy_(mine)

        return self._run("reduce_scatter", self._nbytes(input),
                         lambda a: dist.all_reduce(buf, op=op, group=self.group, async_op=a),
                         async_op, path="all_reduce", then=take)

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        self._run("all_gather_object", 0,
                  lambda a: dist.all_gather_object(out, obj, group=self.group), False)
        return out

    def barrier(self):
        self._run("barrier", 0, lambda a: dist.barrier(group=self.group), False)
