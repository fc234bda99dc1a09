"""Which data-parallel ranks share a host: the intra-host and inter-host groups qgZ reduces over.

A stand-in, kept in this one file: issue 24's topology part (``engine/host_groups.py``) builds
the same two groups for every ZeRO++ option; at merge this module's ``host_groups`` is replaced
by that one.

Hosts come from ``LOCAL_WORLD_SIZE`` (ranks per host; the launcher gives consecutive ranks to a
host), or, for tests on one machine, ``DSLAUNCH_FAKE_HOSTS=N``: the ranks split into N
consecutive blocks, each treated as a host (4 local ranks, N=2: ranks 0-1 and 2-3).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

FAKE_HOSTS_ENV = "DSLAUNCH_FAKE_HOSTS"


@dataclass
class HostGroups:
    local_size: int  # data-parallel ranks per host
    hosts: int
    host: int  # this rank's host index
    local_rank: int  # this rank's index within its host
    intra: object  # process group of this host's ranks (None with one rank per host)
    inter: object  # process group of the ranks with this local_rank on every host


def _ranks_per_host(world: int) -> int:
    fake = os.environ.get(FAKE_HOSTS_ENV, "").strip()
    if fake:
        n = int(fake)
        if n < 1 or world % n:
            raise ValueError(f"{FAKE_HOSTS_ENV}={fake}: must divide the world size {world}")
        return world // n
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if local < 1 or world % local:
        raise ValueError(f"LOCAL_WORLD_SIZE={local} does not divide the world size {world}: "
                         "qgZ needs the same number of ranks on every host")
    return local


def host_groups(comm) -> HostGroups:
    """The groups for ``comm``'s ranks (the data-parallel group, which must be the world); a
    collective call: every rank makes it, in the same order."""
    world = dist.get_world_size()
    if comm.world_size != world:  # several data-parallel groups would each need their own
        raise ValueError("zero_optimization.zero_quantized_gradients: the data-parallel group "
                         f"must be the whole world for now ({comm.world_size} of {world} ranks: "
                         "no pipeline, tensor or sequence parallelism with qgZ)")
    world_ranks = list(range(world))
    per_host = _ranks_per_host(world)
    by_host: dict = {}
    for r in world_ranks:
        by_host.setdefault(r // per_host, []).append(r)
    hosts = [by_host[h] for h in sorted(by_host)]
    local = len(hosts[0])
    if any(len(h) != local for h in hosts):
        raise ValueError("qgZ: the data-parallel group has different numbers of ranks on its "
                         f"hosts ({[len(h) for h in hosts]})")
    me = dist.get_rank()
    intra = inter = None
    host = local_rank = 0
    for hi, members in enumerate(hosts):  # every rank creates every group, in the same order
        g = dist.new_group(members) if local > 1 else None
        if me in members:
            intra, host, local_rank = g, hi, members.index(me)
    for li in range(local):
        g = dist.new_group([h[li] for h in hosts]) if len(hosts) > 1 else None
        if li == local_rank:
            inter = g
    return HostGroups(local, len(hosts), host, local_rank, intra, inter)
