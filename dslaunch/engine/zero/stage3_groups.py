"""The groups ZeRO stage 3 partitions over and communicates in: plain, hpZ (ZeRO++) and MiCS.

- plain ZeRO-3: parameters, gradients and optimizer states partitioned over all data-parallel
  ranks; every all-gather and reduce-scatter spans them all.
- hpZ, ``zero_hpz_partition_size: h`` (> 1; normally the ranks per host): partitioned as plain
  (the *primary* shard), but each gather from the primary shards also leaves on every rank a
  *secondary* shard, its 1/h of the bucket within its hpZ group (consecutive blocks of h ranks,
  as DeepSpeed makes them). Until the next optimizer step changes the weights, a re-gather of the
  bucket (backward, a forward that released it) reads the secondaries over the hpZ group only,
  so it stays on the host. Costs 1/h of the model (training dtype) per rank, kept between steps.
- MiCS, ``mics_shard_size: s`` (> 0): partitioned over *shard groups* of s consecutive ranks
  and replicated across them. Parameter all-gathers and the gradient reduce-scatter span the
  shard group only; the reduced gradient chunk is then all-reduced over the *replicate group*
  (the ranks at the same position in every shard group; DeepSpeed reduces across replicas the
  same way, in its case once per accumulation boundary: here at every micro-step, bucket by
  bucket). ``mics_hierarchical_params_gather``: a shard group spanning several hosts gathers in
  two steps, across hosts among the ranks with the same local index, then within the host.

One object (``Stage3Comms``) says which group each collective runs in, so the call sites stay
``all_gather`` / ``secondary_gather`` / ``reduce_scatter``; the groups come from
``engine/comm/host_groups.py`` and book into the engine's comm stats, split intra- vs inter-host.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dslaunch.engine.comm import host_groups


class Stage3Comms:
    """``world``: the data-parallel comm (the engine's); ``part``: the comm parameters are
    partitioned over (``world``, or the MiCS shard group); ``replica``: MiCS's replicate group
    (None: no replicas); ``hpz``: the hpZ group (None: no secondary shards)."""

    def __init__(self, zero, comm):
        self.world = self.part = comm
        self.replica = self.hpz = self.hier = None
        if not dist.is_initialized() or comm.world_size == 1:
            return
        if comm.world_size == dist.get_world_size():  # the comm stats split by hosts
            host_groups.label(comm)
        hpz, mics = zero.zero_hpz_partition_size, zero.mics_shard_size
        n = comm.world_size
        if hpz > 1:
            if n % min(hpz, n):
                raise ValueError(f"zero_optimization.zero_hpz_partition_size {hpz} does not "
                                 f"divide the {n} data-parallel ranks (set it to the ranks per "
                                 "host)")
            self.hpz = self._shared(host_groups.block_comm(min(hpz, n)))
        if mics > 0:
            if n % mics:
                raise ValueError(f"zero_optimization.mics_shard_size {mics} does not divide the "
                                 f"{n} data-parallel ranks")
            self.part = self._shared(host_groups.block_comm(mics))
            if mics < n:
                self.replica = self._shared(host_groups.strided_comm(mics))
            if zero.mics_hierarchical_params_gather:
                self.hier = self._hierarchy(mics)

    @classmethod
    def plain(cls, comm) -> "Stage3Comms":
        """Every collective over ``comm`` (no hosts looked up)."""
        self = cls.__new__(cls)
        self.world = self.part = comm
        self.replica = self.hpz = self.hier = None
        return self

    def _shared(self, c):
        c._stats = self.world._stats  # one book: the engine's comm_stats()
        return c

    def _hierarchy(self, s):
        """(inter, intra, hosts spanned) for the hierarchical gather inside a shard group."""
        topo = host_groups.topology()
        inter, intra = [], []
        for block in host_groups.blocks(topo.world, s):
            hosts = sorted({topo.host_of[r] for r in block})
            per_host = [[r for r in block if topo.host_of[r] == h] for h in hosts]
            if len(hosts) < 2:
                raise ValueError(
                    f"zero_optimization.mics_hierarchical_params_gather: the shard group "
                    f"{block[0]}-{block[-1]} lies on one host; the hierarchical gather is for "
                    "shard groups that span hosts (raise mics_shard_size or turn it off)")
            if len({len(x) for x in per_host}) != 1 or sum(per_host, []) != block:
                raise ValueError(
                    "zero_optimization.mics_hierarchical_params_gather needs every shard group "
                    "to hold the same number of consecutive ranks on each host it spans")
            intra += per_host
            inter += [list(x) for x in zip(*per_host)]
        return (self._shared(host_groups.comm_of(inter, "mics_inter")),
                self._shared(host_groups.comm_of(intra, "mics_intra")))

    # -- the collectives -----------------------------------------------------------------------
    def all_gather(self, full, src, async_op=False):
        """The bucket ``full`` from every partition rank's chunk ``src`` (the primary gather).
        The hierarchical gather runs synchronously (returns None)."""
        if self.hier is None:
            return self.part.all_gather_into_tensor(full, src, async_op=async_op)
        inter, intra = self.hier
        c = src.numel()
        hosts, per = inter.world_size, intra.world_size
        across = torch.empty(hosts * c, dtype=src.dtype, device=full.device)
        inter.all_gather_into_tensor(across, src)  # [host][c] at this local index
        both = torch.empty(per * hosts * c, dtype=src.dtype, device=full.device)
        intra.all_gather_into_tensor(both, across)  # [local index][host][c]
        full.view(hosts, per, c).copy_(both.view(per, hosts, c).transpose(0, 1))
        return None

    def secondary_slice(self, numel: int):
        """(lo, hi) of a bucket of ``numel`` elements this rank keeps as its hpZ secondary."""
        c = numel // self.hpz.world_size
        return self.hpz.rank * c, (self.hpz.rank + 1) * c

    def secondary_gather(self, full, secondary, async_op=False):
        """The bucket ``full`` from the hpZ group's secondary shards (stays in the group)."""
        return self.hpz.all_gather_into_tensor(full, secondary, async_op=async_op)

    def reduce_scatter(self, out, send):
        """This rank's chunk of the gradients summed over every data-parallel rank: reduce-
        scattered in the partition group, then (MiCS) all-reduced across the replicas."""
        self.part.reduce_scatter_tensor(out, send, input_is_scratch=True)
        if self.replica is not None:
            self.replica.all_reduce(out)
