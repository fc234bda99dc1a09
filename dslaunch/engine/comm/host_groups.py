"""Which ranks share a host, and the process groups built from that (ZeRO++ hpZ, MiCS, qgZ).

The topology is learnt once per process, the first time anything asks (``topology()``; a
collective over the world: every rank must call it, in the same order as the other groups):
each rank's host name is all-gathered (straight through torch.distributed, not booked in the
comm stats). Hosts are numbered in order of their lowest rank; a rank's *local index* is its
position among its host's ranks (the launcher's ``LOCAL_RANK`` under dslaunch / torchrun).

``DSLAUNCH_FAKE_HOSTS=N`` makes one machine look like N hosts without any collective: the world
is split into N consecutive equal blocks of ranks (ranks 0..W/N-1 are "host 0", ...). Meant for
cheap tests and benchmarks of the hierarchical paths with a few local ranks; the real multi-host
check runs on the namespace hosts (tests/multihost).

API (each call returns a new ``Comm`` of ``engine/comm/collectives.py``, with its own book of stats, over a
process group made once and cached; its ``link`` says whether the group stays on one host,
``"intra_host"``, or crosses hosts, ``"inter_host"``, which the comm stats split bytes by):

- ``topology()`` -> ``HostTopology``: ``host_of[rank]``, ``ranks_of_host(h)``, ``local_index``;
- ``intra_host_comm()``: the ranks on this rank's host;
- ``inter_host_comm()``: the ranks with this rank's local index, one per host (every host must
  run the same number of ranks);
- ``block_comm(size)``: the consecutive block of ``size`` ranks holding this rank (DeepSpeed's
  hpZ group and MiCS shard group); ``strided_comm(size)``: the ranks at this rank's position in
  every such block (MiCS's replicate group);
- ``host_layout()``: the same as raw process groups (``intra``, ``inter``, sizes and indices),
  for code that calls torch.distributed itself (qgZ's hierarchical reduce);
- ``label(comm)``: set ``comm.link`` (and ``comm.hosts``, the group's ranks by host, where it
  spans hosts with several ranks on each) from the topology (the engine's world comm);
- ``comm_of(groups, what)``: the comm of this rank among ``groups`` (a partition of the world
  into rank lists, made on every rank).

New groups are made with ``dist.new_group`` on every rank for every block (torch requires all
ranks to take part in making each group), so call these on all ranks alike.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch.distributed as dist

from dslaunch.engine.comm.collectives import Comm
from dslaunch.engine.comm.hierarchical import INTER, INTRA, HostRanks

FAKE_HOSTS_ENV = "DSLAUNCH_FAKE_HOSTS"


@dataclass(frozen=True)
class HostTopology:
    host_of: tuple  # host index of each global rank
    rank: int  # this process's global rank

    @property
    def world(self) -> int:
        return len(self.host_of)

    @property
    def num_hosts(self) -> int:
        return len(set(self.host_of))

    def ranks_of_host(self, h: int) -> list:
        return [r for r, x in enumerate(self.host_of) if x == h]

    @property
    def host(self) -> int:
        return self.host_of[self.rank]

    @property
    def local_index(self) -> int:
        return self.ranks_of_host(self.host).index(self.rank)

    def ranks_per_host(self) -> int:
        """The common number of ranks per host; a clear error where hosts differ."""
        sizes = {len(self.ranks_of_host(h)) for h in set(self.host_of)}
        if len(sizes) != 1:
            raise ValueError(f"hosts run different numbers of ranks ({sorted(sizes)}): the "
                             "inter-host groups need the same number on every host")
        return sizes.pop()

    def link(self, ranks) -> str:
        """``"intra_host"`` when ``ranks`` all live on one host, else ``"inter_host"``."""
        return INTRA if len({self.host_of[r] for r in ranks}) <= 1 else INTER


def fake_hosts(world: int, environ=None) -> tuple | None:
    """The host index of each rank under ``DSLAUNCH_FAKE_HOSTS`` (None when unset)."""
    env = os.environ if environ is None else environ
    raw = env.get(FAKE_HOSTS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1 or world % n:
        raise ValueError(f"{FAKE_HOSTS_ENV}={raw!r}: expected a whole number of hosts that "
                         f"divides the world size {world}")
    per = world // n
    return tuple(r // per for r in range(world))


def hosts_from_names(names) -> tuple:
    """Host index per rank from each rank's host name, hosts numbered by their lowest rank."""
    order: dict = {}
    for n in names:
        order.setdefault(n, len(order))
    return tuple(order[n] for n in names)


_TOPOLOGY: HostTopology | None = None
_GROUPS: dict = {}  # (what, rank lists) -> (this rank's process group, its link)
_WORLD = None  # the default group the caches belong to (a new world starts them afresh)


def topology() -> HostTopology:
    """This job's hosts (collective on the first call, cached after)."""
    global _TOPOLOGY, _WORLD
    if not dist.is_initialized():
        return HostTopology((0,), 0)
    if _WORLD is not dist.group.WORLD:
        _TOPOLOGY, _WORLD = None, dist.group.WORLD
        _GROUPS.clear()
    if _TOPOLOGY is not None:
        return _TOPOLOGY
    rank, world = dist.get_rank(), dist.get_world_size()
    host_of = fake_hosts(world)
    if host_of is None:
        names = [socket.gethostname()] * world
        if world > 1:
            dist.all_gather_object(names, names[0])
        host_of = hosts_from_names(names)
    _TOPOLOGY = HostTopology(host_of, rank)
    return _TOPOLOGY


def comm_of(all_groups: list, what: str):
    """A ``Comm`` over the group of ``all_groups`` (a partition of the world into rank lists)
    that holds this rank; every group is made on every rank (torch's rule), once."""
    topo = topology()
    key = (what, tuple(tuple(g) for g in all_groups))
    if key not in _GROUPS:
        for ranks in all_groups:
            group = dist.new_group(list(ranks)) if len(all_groups) > 1 else dist.group.WORLD
            if topo.rank in ranks:
                _GROUPS[key] = (group, topo.link(ranks))
    group, link = _GROUPS[key]
    comm = Comm(group)
    _place(comm, sorted(next(g for g in all_groups if topo.rank in g)), topo)
    return comm


def _place(comm, ranks, topo: HostTopology) -> None:
    """Tell ``comm`` (over the global ``ranks``, in group order) its link and, where it spans
    hosts with several ranks on each, its ranks by host (its gathers and reduce-scatters then
    cross hosts once per piece: comm_hier.py)."""
    comm.link = topo.link(ranks)
    by_host: dict = {}
    for i, r in enumerate(ranks):
        by_host.setdefault(topo.host_of[r], []).append(i)
    hosts = [by_host[h] for h in sorted(by_host)]
    comm.hosts = HostRanks(hosts, comm.rank) if HostRanks.usable(hosts) else None


def blocks(world: int, size: int) -> list:
    if size < 1 or world % size:
        raise ValueError(f"a group size of {size} does not divide the {world} ranks")
    return [list(range(i, i + size)) for i in range(0, world, size)]


def block_comm(size: int):
    """The consecutive block of ``size`` ranks holding this rank."""
    return comm_of(blocks(topology().world, size), "block")


def strided_comm(size: int):
    """The ranks at this rank's position in every consecutive block of ``size``."""
    world = topology().world
    return comm_of([list(range(i, world, size)) for i in range(size)], "strided")


def intra_host_comm():
    topo = topology()
    return comm_of([topo.ranks_of_host(h) for h in sorted(set(topo.host_of))], "intra")


def inter_host_comm():
    topo = topology()
    per = topo.ranks_per_host()
    hosts = sorted(set(topo.host_of))
    return comm_of([[topo.ranks_of_host(h)[j] for h in hosts] for j in range(per)], "inter")


@dataclass(frozen=True)
class HostLayout:
    """The host layout as raw process groups (for code that calls torch.distributed itself)."""
    local_size: int  # ranks per host
    hosts: int
    host: int  # this rank's host index
    local_rank: int  # this rank's index within its host
    intra: object  # process group of this host's ranks (None with one rank per host)
    inter: object  # process group of the ranks with this local index (None with one host)


def host_layout() -> HostLayout:
    """This rank's host layout; every host must run the same number of ranks (collective on
    first use, like the groups)."""
    topo = topology()
    per = topo.ranks_per_host()
    intra = intra_host_comm().group if per > 1 else None
    inter = inter_host_comm().group if topo.num_hosts > 1 else None
    return HostLayout(per, topo.num_hosts, topo.host, topo.local_index, intra, inter)


def label(comm) -> None:
    """Set ``comm.link`` and ``comm.hosts`` (the world comm, or any other) from the topology."""
    if not dist.is_initialized():
        return
    ranks = list(range(dist.get_world_size())) if comm.group in (None, dist.group.WORLD) \
        else dist.get_process_group_ranks(comm.group)
    _place(comm, ranks, topology())
