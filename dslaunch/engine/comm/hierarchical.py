"""Reduce-scatter and all-gather over a group that spans hosts, each byte crossing hosts once.

Why: the flat pairwise exchange (``comm_pairwise.py``) has every rank send its piece to every
other rank, so with R ranks per host each piece crosses to another host R times; gloo's ring
crosses hosts about once per link in the ring. Here a piece crosses to each other host once, to
the rank with the same local index there, which passes it on over its own host's loopback:

- all-gather, rank (h, l) (host h, local index l): sends its chunk to (h', l) on every other host
  and to (h, l') on its own; once the chunks of (h', l) have arrived it forwards them to every
  (h, l'). Inter-host bytes per call, summed over ranks: (H - 1) x the output, against
  R (H - 1) x for the flat exchange and about H x for a ring with each host's ranks adjacent.
- reduce-scatter: (h, l) sends (h, l') the chunks of every (h'', l') (host-local partial sums
  start on the loopback), sums what it gets for the chunks of every (h'', l) in local-index order,
  then sends each partial sum to its owner (h'', l) and sums the H partials in host order. Every
  chunk is summed by its one owner, in an order that depends only on the layout.

Every rank sends (N - 1)/N of the reduce-scatter input and N - 1 times the all-gather input, the
same bytes as the flat exchange; only which links carry them changes.

The second half of each collective needs the first half's pieces, so it runs on one relay thread
per process group (whichever ``Comm`` issued it), in the order the collectives were issued on
that group (the same on every rank, so the thread's messages pair up across ranks without
waiting on the caller's ``wait`` order). Tags sit above ``comm_pairwise``'s, one per half.
"""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist

from dslaunch.engine.comm.pairwise import PairwiseWork, global_rank

DIRECT_TAG = 0x10000 + 3  # the first half, posted by the caller
RELAY_TAG = 0x10000 + 4  # the second half, posted by the relay thread


# the two kinds of link a group spans (a ``Comm``'s ``link``; host_groups.py says which)
INTRA, INTER = "intra_host", "inter_host"


class HostRanks:
    """The group's ranks by host: ``hosts[h][l]`` is the group rank of local index ``l`` on host
    ``h`` (every host the same number of ranks)."""

    def __init__(self, hosts: list, rank: int):
        self.hosts = [list(h) for h in hosts]
        self.host, self.local = next((h, i) for h, ranks in enumerate(self.hosts)
                                    for i, r in enumerate(ranks) if r == rank)

    @property
    def per_host(self) -> int:
        return len(self.hosts[0])

    @staticmethod
    def usable(hosts: list) -> bool:
        """Worth it (and possible): two hosts or more, two ranks or more on each, all alike."""
        return len(hosts) > 1 and len({len(h) for h in hosts}) == 1 and len(hosts[0]) > 1


class Relay:
    """One thread that runs the second halves, in issue order; started on first use."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = None

    def submit(self, job) -> "RelayWork":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dslaunch-comm-relay", daemon=True)
            self._thread.start()
        work = RelayWork()
        self._jobs.put((job, work))
        return work

    def _loop(self):
        while True:
            job, work = self._jobs.get()
            try:
                job()
            except BaseException as e:  # handed to whoever waits on this collective
                work.error = e
            work.done.set()


_RELAYS: dict = {}  # process group -> its Relay


def relay_for(group) -> Relay:
    """The one relay of ``group`` (None: the default group): every comm over a group shares it,
    so the second halves on that group keep their issue order."""
    key = dist.group.WORLD if group is None else group
    if key not in _RELAYS:
        _RELAYS[key] = Relay()
    return _RELAYS[key]


class RelayWork:
    def __init__(self):
        self.done = threading.Event()
        self.error = None

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return self.done.is_set()


def _exchange(pairs, group, tag) -> list:
    """Post (send tensor, to, recv tensor, from) exchanges; the works."""
    works = []
    for send, dst, recv, src in pairs:
        works.append(dist.isend(send, global_rank(group, dst), group=group, tag=tag))
        works.append(dist.irecv(recv, global_rank(group, src), group=group, tag=tag))
    return works


def _finish(works, group, second_half, async_op: bool, keep=()):
    """Run ``second_half`` on ``group``'s relay once ``works`` are done; the caller's handle
    (None when synchronous, the torch.distributed convention)."""
    first = PairwiseWork(works, keep=keep)

    def job():
        first.wait()
        second_half()

    work = relay_for(group).submit(job)
    if async_op:
        return work
    work.wait()
    return None


def all_gather(output: torch.Tensor, input: torch.Tensor, group, layout: HostRanks,
               async_op: bool = False):
    """``output`` (world x ``input``, contiguous) gets every rank's ``input`` in rank order."""
    c = input.numel()
    flat = output.view(-1)
    hosts, h, li = layout.hosts, layout.host, layout.local
    me = hosts[h][li]

    def slot(r):
        return flat[r * c:(r + 1) * c]

    src = input.reshape(-1)
    if slot(me).data_ptr() != src.data_ptr():
        slot(me).copy_(src)
    # first half: my chunk to my peers on other hosts and on mine
    pairs = [(slot(me), hosts[g][li], slot(hosts[g][li]), hosts[g][li])
             for g in range(len(hosts)) if g != h]
    pairs += [(slot(me), hosts[h][k], slot(hosts[h][k]), hosts[h][k])
              for k in range(layout.per_host) if k != li]
    works = _exchange(pairs, group, DIRECT_TAG)

    def forward():  # the chunks that reached me from other hosts, on to my host
        relayed = [(slot(hosts[g][li]), hosts[h][k], slot(hosts[g][k]), hosts[h][k])
                   for k in range(layout.per_host) if k != li
                   for g in range(len(hosts)) if g != h]
        PairwiseWork(_exchange(relayed, group, RELAY_TAG)).wait()

    return _finish(works, group, forward, async_op, keep=(flat,))


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group, layout: HostRanks,
                   async_op: bool = False):
    """``output`` (one chunk) gets the sum over ranks of this rank's chunk of ``input``."""
    c = output.numel()
    flat = input.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    hosts, h, li = layout.hosts, layout.host, layout.local
    n_hosts, per = len(hosts), layout.per_host

    def chunk(r):
        return flat[r * c:(r + 1) * c]

    # first half: to each (h, k) the chunks of every (g, k); from it, its pieces of every (g, l)
    got = torch.empty((per, n_hosts, c), dtype=input.dtype, device=input.device)
    pairs = [(chunk(hosts[g][k]), hosts[h][k], got[k, g], hosts[h][k])
             for k in range(per) if k != li for g in range(n_hosts)]
    works = _exchange(pairs, group, DIRECT_TAG)
    partial = torch.empty((n_hosts, c), dtype=input.dtype, device=input.device)
    owned = torch.empty((n_hosts, c), dtype=input.dtype, device=input.device)

    def reduce():
        for g in range(n_hosts):  # this host's sum for (g, l), in local-index order
            for k in range(per):
                piece = chunk(hosts[g][li]) if k == li else got[k, g]
                partial[g].copy_(piece) if k == 0 else partial[g].add_(piece)
        others = [(partial[g], hosts[g][li], owned[g], hosts[g][li])
                  for g in range(n_hosts) if g != h]
        PairwiseWork(_exchange(others, group, RELAY_TAG)).wait()
        out = output.view(-1)
        for g in range(n_hosts):  # the hosts' sums in host order
            piece = partial[h] if g == h else owned[g]
            out.copy_(piece) if g == 0 else out.add_(piece)

    return _finish(works, group, reduce, async_op, keep=(flat, got))
