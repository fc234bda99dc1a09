"""The parameter side of ZeRO stages 1 and 2, a mix-in of ``stage12.ZeroStage12Strategy``: after
the step, every bucket's updated chunks (this rank's fp32 masters, or the chunks of the flat buffer
themselves) are all-gathered into the flat parameter buffer on every rank.
``allgather_bucket_size`` is accepted; the all-gather uses the reduction's buckets
(``grad_reduce.COMM_BUCKET_CAP``).

The mix-in reads what the strategy sets up (``stage12.py``): ``groups`` (each with ``buckets``,
``chunks``, ``master``, ``layout``, ``comm``, ``world``, ``shard_params``), ``need_master``,
``dtype``, ``device`` and ``optimizer``.
"""

from __future__ import annotations

from dslaunch.engine.base import partition as P


class ParamGather:
    """The all-gather of the updated parameters (the module's docstring), mixed into the
    strategy."""

    def _all_gather_params(self, sources=None):
        """Every bucket's updated chunks to every rank. The buckets' all-gathers are all posted
        first and then waited for: one after another, each bucket paid the exchange's latency
        (27M fp32 parameters, 2 ranks on gloo: 58 ms in turn, 33 ms posted together). Chunks
        read from an NVMe swap file are valid only until the next is read, so those go one by
        one."""
        swapped = sources is None and self.need_master and self._masters_swapped()
        if sources is None:
            sources = self._master_chunks() if self.need_master else (
                (gi, bi, c) for gi, g in enumerate(self.groups) for bi, c in enumerate(g.chunks))
        posted = []  # (work, input): an input stays alive until its gather is done
        for gi, bi, src in sources:
            g = self.groups[gi]
            bview = g.buckets[bi]
            inp = src.to(device=self.device, dtype=self.dtype)
            if g.world == 1:  # the chunk is the bucket: nothing to gather, at most a copy
                if inp.data_ptr() != bview.data_ptr():
                    bview.copy_(inp.reshape(bview.shape))
                continue
            lo = bview.data_ptr()
            if lo <= inp.data_ptr() < lo + bview.numel() * bview.element_size() and \
                    _aliasing_refused(g.comm, inp):
                inp = inp.clone()  # gloo's own all-gather: the input must not alias the output
            if swapped:
                g.comm.all_gather_into_tensor(bview, inp)
            else:
                posted.append((g.comm.all_gather_into_tensor(bview, inp, async_op=True), inp))
        for work, _ in posted:
            work.wait()

    def _masters_swapped(self) -> bool:
        """Whether the fp32 masters are read from the optimizer's NVMe swap file now."""
        return bool(getattr(self.optimizer, "swap_params", False)) and \
            not getattr(self, "masters_resident", False)

    def _master_chunks(self):
        """(group index, bucket index, fp32 master chunk), in group and bucket order. When the
        optimizer keeps the masters in its NVMe swap file (``nvme/masters.py``) and they are not
        swapped in, they are read from the file sub-group by sub-group (each chunk is valid until
        the next is taken)."""
        opt = self.optimizer
        if self._masters_swapped():
            where = {id(sp): (gi, bi) for gi, g in enumerate(self.groups)
                     for bi, sp in enumerate(g.shard_params)}
            expect = [(gi, bi) for gi, g in enumerate(self.groups)
                      for bi in range(len(g.shard_params))]
            for n, p in enumerate(opt.iter_params()):
                if where[id(p)] != expect[n]:  # every rank must all-gather in the same order
                    raise RuntimeError("the swapped optimizer's parameters are not in shard order")
                yield (*where[id(p)], p.detach())
            return
        for gi, g in enumerate(self.groups):
            for bi, c in enumerate(P.shard_chunks(g.master, g.layout)):
                yield gi, bi, c


def _aliasing_refused(comm, tensor) -> bool:
    """Whether ``comm``'s all-gather of ``tensor`` may not read its input from its output: only
    gloo's pairwise and all_reduce paths (``engine/comm/collectives.py``; pairwise is gloo's default) are known
    to allow it. (gloo's own all-gather refuses; NCCL's in-place form is untested here.)"""
    paths_for = getattr(comm, "paths_for", None)
    if paths_for is None or tensor.device.type != "cpu":
        return True
    return paths_for(tensor)["all_gather"] == "native"
