"""Where stage 3's parameters live, and when they are gathered and released.

``ParamStore`` is the one place that knows where this rank's parameter shard lives: per optimizer
group a flat ``local`` tensor (this rank's chunk of every bucket, concatenated, in the training
dtype; on the CPU with ``offload_param: cpu``; in a file with ``offload_param: nvme``, see
``nvme/param_store.py``), and per bucket a ``full`` buffer that the model's parameters are views
of. A bucket's full buffer has storage only while it is gathered (``untyped_storage().resize_(0)``
frees it: parameters and the tensors
autograd saved stay valid views and are refilled in place by the next all-gather).

``HostParamStore`` is the store of ``offload_param: cpu`` (ZeRO-Infinity's CPU tier and
ZeRO-Inference): the shard in (pinned) host memory, full buffers without storage from the start,
and with one partition rank each fetch a host-to-device copy, prefetches on a side stream with an
event the compute stream waits on (``get_accelerator()`` streams: no-ops on a CPU).

``FetchCoordinator`` decides when: a unit (``stage3_units.py``) is gathered just before its
module's forward and its backward and released after (backward release is the strategy's, once
the unit's gradients are reduced). The first training forward (any forward of a forward-only
engine) records the order modules run in; later passes that follow it (evaluation and generation
too) prefetch the next units along that order asynchronously
(``stage3_prefetch_bucket_size`` elements in flight at most), keep a unit gathered past its
forward when its next use (in backward) comes within ``stage3_max_reuse_distance`` elements of
other units or within the prefetch window (it would be gathered again at once), and neither
prefetch nor keep beyond ``stage3_max_live_parameters`` gathered elements (a unit a module needs
right now is always gathered). Past the prefetched units, a store whose shards take time to read
(NVMe) is told the next units (``read_ahead``).
"""

from __future__ import annotations

import torch

from dslaunch.engine.base import partition as P

RELEASED, IN_FLIGHT, GATHERED = 0, 1, 2


class ParamStore:
    """This rank's parameter shard, in memory (on the device, or on the CPU with
    ``offload_param: cpu``). ``nvme.param_store.NVMeParamStore`` keeps it in a file instead; the
    strategy touches the shard only through the methods of "the seam" below."""

    read_ahead_depth = 0  # units whose shards ``read_ahead`` may load before they are gathered
    # qwZ: ``quantized_gather(full, src, async_op)`` (zero/quantized_comm.py) replaces the
    # all-gather of forward/backward fetches; None: every gather is exact
    quantized_gather = None
    # in-process recovery: an abandoned step's forward gathers zeros, with no collective
    # (Stage3Strategy.dry_forward)
    dry = False

    def __init__(self, plan, dtype, device, shard_device, comm):
        """``comm``: a ``stage3_groups.Stage3Comms`` (the groups each gather runs in), or a
        ``Comm`` (plain: partitioned over its ranks)."""
        if not hasattr(comm, "secondary_gather"):
            from dslaunch.engine.zero.stage3_groups import Stage3Comms

            comm = Stage3Comms.plain(comm)
        self.plan, self.dtype, self.device, self.comm = plan, dtype, device, comm
        self.shard_device = shard_device
        self.full = {}
        self.state = {}
        self.work = {}
        # hpZ: per bucket this rank's secondary shard, and which of them hold the current weights
        self.secondary, self.fresh, self.approx_secondary = {}, set(), set()
        self.from_shard = set()  # in-flight gathers that read this rank's primary shard
        self.live = 0  # gathered or in-flight elements of non-persistent buckets
        self.approx = set()  # keys whose full buffer holds dequantized (qwZ) values
        self.max_live = 0
        self._alloc_full()
        self.nbytes = {k: t.numel() * t.element_size() for k, t in self.full.items()}
        self._make_shards()

    def _alloc_full(self):
        """Every bucket's full buffer, gathered (the strategy partitions, then releases)."""
        for gi, lay in enumerate(self.plan.layouts):
            for bi, b in enumerate(lay.buckets):
                key = (gi, bi)
                self.full[key] = torch.empty(b.numel, dtype=self.dtype, device=self.device)
                self.state[key] = GATHERED

    def _make_shards(self):
        self.local = [torch.zeros(lay.shard_numel, dtype=self.dtype, device=self.shard_device)
                      for lay in self.plan.layouts]
        self.chunks = [P.shard_chunks(loc, lay) for loc, lay in zip(self.local, self.plan.layouts)]

    # -- the seam --------------------------------------------------------------------------------
    def local_shards(self) -> list:
        """This rank's parameter shard per optimizer group (1-D, training dtype)."""
        return self.local

    def param_view(self, key, slot) -> torch.Tensor:
        return self.full[key][slot.start: slot.start + slot.numel].view(slot.shape)

    def chunk_views(self, gi) -> list:
        """Group ``gi``'s chunks as tensors the optimizer may step in place (fp32 without
        masters); storage-less ``meta`` tensors where the shard is not in memory."""
        return self.chunks[gi]

    def read_shard(self, gi) -> torch.Tensor:
        """Group ``gi``'s whole shard (read-only; a copy where it does not live in memory)."""
        return self.local[gi]

    def write_chunk(self, key, values) -> None:
        """New values (any dtype / device) for this rank's chunk of bucket ``key``."""
        self.chunks[key[0]][key[1]].copy_(values)
        self.weights_changed()

    def write_shard(self, gi, values) -> None:
        """New values for group ``gi``'s whole shard (after the optimizer step)."""
        self.local[gi].copy_(values)
        self.weights_changed()

    def resident_tensors(self) -> list:
        """The tensors holding the shard in memory (for memory_breakdown)."""
        return list(self.local)

    def nvme_bytes(self) -> int:
        return 0

    def settle(self) -> None:
        """Before the host writes the shards in place (an optimizer stepping ``chunk_views``):
        let every fetch still reading them finish."""

    def read_ahead(self, keys) -> None:
        """Start loading the shards of ``keys`` (the next units) where that takes time."""

    def _source(self, key) -> torch.Tensor:
        """The all-gather's input for bucket ``key``: this rank's chunk, on the device."""
        src = self.chunks[key[0]][key[1]]
        return src if src.device == self.device else src.to(self.device, non_blocking=True)

    def _source_done(self, key) -> None:
        """The all-gather of ``key`` has finished with its input."""

    # -- gather / release ------------------------------------------------------------------------
    def gather(self, key, async_op=False, exact=False):
        """``exact``: the shard's values even with qwZ (for whoever reads or writes weights:
        checkpoints, GatheredParameters); a unit already gathered quantized is re-gathered."""
        st = self.state[key]
        if exact and st != RELEASED and key in self.approx:
            self.wait(key)
            self.comm.all_gather(self.full[key], self._source(key))
            self._source_done(key)
            self.approx.discard(key)
            return
        if st == GATHERED:
            return
        if st == IN_FLIGHT:
            if not async_op:
                self.wait(key)
            return
        full = self.full[key]
        full.untyped_storage().resize_(self.nbytes[key])
        self.live += full.numel()
        self.max_live = max(self.max_live, self.live)
        if self.dry:
            full.zero_()
            self.state[key] = GATHERED
            return
        work = self._all_gather(key, full, async_op, exact)
        if async_op and work is not None:
            self.work[key] = work
            self.state[key] = IN_FLIGHT
        else:
            self.state[key] = GATHERED
            self._gathered(key)

    def _all_gather(self, key, full, async_op, exact=False):
        """The one all-gather of a bucket (the seam for what travels and in which group): from
        the hpZ secondaries over the hpZ group while they hold the current weights (unless an
        exact gather is asked and they hold qwZ's dequantized values), else from this rank's
        shard over the partition group, quantized with qwZ unless ``exact``. Returns the work
        (None: done)."""
        if key in self.fresh and not (exact and key in self.approx_secondary):
            if key in self.approx_secondary:
                self.approx.add(key)
            return self.comm.secondary_gather(full, self.secondary[key], async_op=async_op)
        self.from_shard.add(key)
        if self.quantized_gather is not None and not exact:
            self.approx.add(key)
            return self.quantized_gather(full, self._source(key), async_op=async_op)
        return self.comm.all_gather(full, self._source(key), async_op=async_op)

    def _gathered(self, key) -> None:
        """Bucket ``key``'s gather has completed: the shard input is free again, and with hpZ
        this rank keeps its secondary slice of the weights just gathered."""
        if key not in self.from_shard:
            return
        self.from_shard.discard(key)
        self._source_done(key)
        if self.comm.hpz is not None and key not in self.plan.persistent:
            lo, hi = self.comm.secondary_slice(self.full[key].numel())
            if key not in self.secondary:
                self.secondary[key] = torch.empty(hi - lo, dtype=self.dtype, device=self.device)
            self.secondary[key].copy_(self.full[key][lo:hi])
            self.fresh.add(key)
            if key in self.approx:  # qwZ: the secondary holds dequantized values
                self.approx_secondary.add(key)
            else:
                self.approx_secondary.discard(key)

    def weights_changed(self) -> None:
        """The shards were written (a step, a load): the hpZ secondaries are stale."""
        self.fresh.clear()

    def secondary_tensors(self) -> list:
        return list(self.secondary.values())

    def wait(self, key):
        if self.state[key] == IN_FLIGHT:
            self.work.pop(key).wait()
            self.state[key] = GATHERED
            self._gathered(key)

    def wait_all(self):
        for key in list(self.work):
            self.wait(key)

    def release(self, key):
        if key in self.plan.persistent or self.state[key] == RELEASED:
            return
        self.wait(key)
        self.full[key].untyped_storage().resize_(0)
        self.state[key] = RELEASED
        self.approx.discard(key)
        self.live -= self.full[key].numel()

    def release_all(self):
        self.wait_all()
        for key in self.full:
            self.release(key)

    def refresh_persistent(self):
        """Persistent buckets stay gathered: bring them up to date with the shards."""
        for key in sorted(self.plan.persistent):
            self.comm.all_gather(self.full[key], self._source(key))
            self._source_done(key)

    def gathered_numel(self) -> int:
        return self.live


class _CopyWork:
    """An asynchronous host-to-device fetch: ``wait()`` makes the compute stream wait for the
    copy stream's event (the host does not block)."""

    __slots__ = ("acc", "event")

    def __init__(self, acc, event):
        self.acc, self.event = acc, event

    def wait(self):
        self.acc.current_stream().wait_event(self.event)


class HostParamStore(ParamStore):
    """``offload_param: cpu`` (ZeRO-Infinity's CPU tier, ZeRO-Inference): this rank's shard lives
    in host memory, pinned when ``pin_memory`` is set and the device can copy from pinned memory
    asynchronously (``get_accelerator().pin_memory``; plain memory on a CPU host). A bucket's full
    buffer on the device has storage only while it is gathered, from the start (the whole model
    never sits on the device, not even while the engine partitions it).

    With one partition rank (no hierarchical, hpZ or qwZ gather) a fetch is one host-to-device
    copy: a prefetch (``async_op``) is issued ``non_blocking`` on a side stream
    (``get_accelerator().Stream()``), after the compute stream's queued work (whose memory the
    allocator may hand to the new buffer), and recorded in an event; ``wait`` makes the compute
    stream wait on that event before the module uses the weights, so copies of the next units run
    while one computes. A synchronous fetch is the same copy on the compute stream (stream
    ordered). With several ranks the chunk goes to the device ``non_blocking`` (from pinned
    memory) and the all-gather follows as in ``ParamStore``. On a CPU the streams and events are
    ``NullStream`` / ``NullEvent``: the same code, done when queued."""

    def __init__(self, plan, dtype, device, shard_device, comm, pin_memory=False):
        from dslaunch.accelerator import get_accelerator

        self.acc = get_accelerator()
        self.pin = bool(pin_memory) and device.type != "cpu"
        self.copy_stream = self.acc.Stream()  # NullStream on a CPU: the same code, in order
        self.h2d_bytes = 0  # bytes fetched host-to-device (all fetches)
        self._reading = False  # copies from the shards issued since the last settle()
        super().__init__(plan, dtype, device, shard_device, comm)

    def _alloc_full(self):
        """Full buffers with no storage (non-persistent ones): the device holds no bucket that is
        not gathered, at any time."""
        for gi, lay in enumerate(self.plan.layouts):
            for bi, b in enumerate(lay.buckets):
                key = (gi, bi)
                self.full[key] = torch.empty(b.numel, dtype=self.dtype, device=self.device)
                if key in self.plan.persistent:
                    self.state[key] = GATHERED
                else:
                    self.full[key].untyped_storage().resize_(0)
                    self.state[key] = RELEASED

    def settle(self) -> None:
        """The host is about to write the shards (an optimizer step, a load): copies that may
        still read them on the device finish first (nothing to wait for on a CPU)."""
        if self._reading:
            self.copy_stream.synchronize()
            self.acc.current_stream().synchronize()
            self._reading = False

    def write_chunk(self, key, values) -> None:
        self.settle()
        super().write_chunk(key, values)

    def write_shard(self, gi, values) -> None:
        self.settle()
        super().write_shard(gi, values)

    def param_view(self, key, slot) -> torch.Tensor:
        st = self.full[key].untyped_storage()
        if st.nbytes() == 0:  # released: a view is cut with the storage there, then freed
            st.resize_(self.nbytes[key])
            view = super().param_view(key, slot)
            st.resize_(0)
            return view
        return super().param_view(key, slot)

    def _make_shards(self):
        self.local = []
        for lay in self.plan.layouts:
            t = torch.zeros(lay.shard_numel, dtype=self.dtype, device=self.shard_device)
            if self.pin and self.shard_device.type == "cpu":
                t = self.acc.pin_memory(t)
            self.local.append(t)
        self.chunks = [P.shard_chunks(loc, lay) for loc, lay in zip(self.local, self.plan.layouts)]

    def pinned(self) -> bool:
        """Whether every shard is in pinned host memory."""
        return all(self.acc.is_pinned(t) for t in self.local) if self.pin else False

    def _direct(self, key, exact) -> bool:
        return (self.comm.part.world_size == 1 and self.comm.hier is None
                and key not in self.fresh and (self.quantized_gather is None or exact))

    def _source(self, key) -> torch.Tensor:
        self._reading = True  # several ranks: a non_blocking copy from the host shard
        return super()._source(key)

    def _all_gather(self, key, full, async_op, exact=False):
        if not self._direct(key, exact):
            return super()._all_gather(key, full, async_op, exact)
        src = self.chunks[key[0]][key[1]]
        self.h2d_bytes += self.nbytes[key]
        self._reading = True
        if not async_op:
            full.copy_(src, non_blocking=True)  # the compute stream: ordered before its use
            return None
        s = self.copy_stream
        s.wait_stream(self.acc.current_stream())  # the buffer may be memory just freed there
        with self.acc.stream(s):
            full.copy_(src, non_blocking=True)
            event = self.acc.Event()
            event.record(s)
        return _CopyWork(self.acc, event)


class FetchCoordinator:
    def __init__(self, store: ParamStore, plan, zero):
        """``zero``: the typed ``zero_optimization`` section (its ``stage3_*`` budgets)."""
        self.store, self.plan, self.zero = store, plan, zero
        self.trace = []  # modules in the order the first training forward ran them
        self.recorded = False
        self.index = {}  # module -> its last position in the trace
        self.after = []  # elements fetched by the units after each trace position
        self.active = {}  # key -> modules running forward that need it right now
        self.pos = 0
        self.on_trace = False
        self.ahead = 0  # forward: trace positions below this were prefetched
        self.behind = None  # backward: trace positions from this on were prefetched
        self.stack = []
        self.running = []  # the hooked modules whose forward runs now, innermost last
        self.kept = []  # keys kept gathered past their forward for reuse, oldest first

    def _make_room(self, keys):
        """Release units kept for reuse (oldest first) until gathering ``keys`` fits in
        ``stage3_max_live_parameters``; units in use now are never touched."""
        for k in keys:
            if k in self.kept:
                self.kept.remove(k)  # in use again
        need = sum(self.plan.numel(k) for k in keys if self.store.state[k] == RELEASED)
        while self.kept and self.store.gathered_numel() + need > self.zero.stage3_max_live_parameters:
            k = self.kept.pop(0)
            if not self.active.get(k):
                self.store.release(k)

    def _unit_numel(self, m) -> int:
        return sum(self.plan.numel(k) for k in self.plan.fetch[m])

    # -- forward ---------------------------------------------------------------------------------
    def begin_forward(self, training: bool):
        # a forward without backward before (evaluation) may have left units gathered
        self.store.release_all()
        self.pos, self.ahead, self.stack, self.kept, self.running = 0, 0, [], [], []
        self.recording = training and not self.recorded
        # every pass that follows the recorded order prefetches along it (evaluation and
        # generation too); only a training pass keeps units for its backward
        self.on_trace = self.recorded

    def end_forward(self):
        if self.recording and self.trace:
            self.recorded = True
            self.index = {m: i for i, m in enumerate(self.trace)}
            sizes = [self._unit_numel(m) for m in self.trace]
            self.after = [sum(sizes[i + 1:]) for i in range(len(sizes))]
        self.recording = False
        self.behind = None

    def pre_forward(self, m):
        self.running.append(m)
        keys = self.plan.fetch.get(m, ())
        if not keys or (self.recorded and m not in self.index):
            # a module with no unit, or one whose unit was found after the recorded pass (a
            # parameter read outside its module, ``stage3_access.py``): gathered when it runs,
            # off the trace (no prefetch, the trace's positions unchanged)
            self.stack.append(None)
            self._acquire(keys)
            return
        if self.recording:
            self.trace.append(m)
        elif self.on_trace and (self.pos >= len(self.trace) or self.trace[self.pos] is not m):
            self.on_trace = False  # this pass runs another order: no prefetch, no keeping
        self.stack.append(self.pos)
        self.pos += 1
        self._acquire(keys)
        if self.on_trace:
            self.ahead = self._prefetch(range(max(self.ahead, self.pos), len(self.trace)),
                                        self.ahead)
            self._read_ahead(range(max(self.ahead, self.pos), len(self.trace)))

    def _acquire(self, keys):
        """Gather ``keys`` for a module that starts running with them (now, synchronously)."""
        self._make_room(keys)
        for k in keys:
            self.active[k] = self.active.get(k, 0) + 1
            self.store.gather(k)

    def read_outside(self, key):
        """A parameter of bucket ``key`` is read by a forward running now, not its module's:
        the innermost running module fetches ``key`` from now on (DeepSpeed registers such a
        parameter as external to that module). Outside any forward nothing is gathered."""
        if not self.running:
            return
        m = self.running[-1]
        if self.plan.add_to_unit(m, key):
            self._acquire([key])  # released with m's other units at its post-forward
        else:
            self.store.gather(key)  # in m's unit already (gathered unless a prefetch is in flight)

    def post_forward(self, m, backward_follows: bool):
        if self.running:
            self.running.pop()
        i = self.stack.pop() if self.stack else None
        # Elements gathered between this forward use and the backward one: the units after it in
        # forward, and again in backward. Within the reuse distance it stays gathered. It stays
        # too when the units still to be fetched before its backward use fit the prefetch window,
        # as DeepSpeed keeps a parameter whose next use its prefetcher has already reached: the
        # prefetcher skips gathered units, and those after this one in forward are kept by the
        # same rule, so only forward's later units count (the last units of forward are the
        # first of backward).
        later = self.after[i] if i is not None and i < len(self.after) else None
        keep = (backward_follows and self.on_trace and later is not None
                and (2 * later < self.zero.stage3_max_reuse_distance
                     or later < self.zero.stage3_prefetch_bucket_size))
        for k in self.plan.fetch.get(m, ()):
            self.active[k] -= 1
            if self.active[k] > 0:
                continue  # an enclosing module still runs with it (tied weights)
            if keep and self.store.gathered_numel() <= self.zero.stage3_max_live_parameters:
                if k not in self.kept:  # backward needs it again soon: no release, no re-gather
                    self.kept.append(k)
                continue
            self.store.release(k)

    # -- backward --------------------------------------------------------------------------------
    def pre_backward(self, m):
        self._make_room(self.plan.fetch[m])
        for k in self.plan.fetch[m]:
            self.store.gather(k)
        j = self.index.get(m)
        if self.recorded and j is not None:
            start = j - 1 if self.behind is None else min(self.behind, j) - 1
            positions = range(start, -1, -1)
            last = self._prefetch(positions, None)
            if last is not None:
                self.behind = last
            self._read_ahead(range((j if self.behind is None else self.behind) - 1, -1, -1))

    def end_backward(self):
        self.store.release_all()
        self.behind, self.kept = None, []

    # -- prefetch --------------------------------------------------------------------------------
    def _read_ahead(self, positions):
        """Past what is prefetched: let the store load the next units' shards (NVMe reads) so
        that their all-gathers do not wait for the drive."""
        depth = self.store.read_ahead_depth
        if not depth:
            return
        keys = []
        for i in positions:
            keys += [k for k in self.plan.fetch[self.trace[i]]
                     if self.store.state[k] == RELEASED and k not in keys]
            if len(keys) >= depth:
                break
        if keys:
            self.store.read_ahead(keys[:depth])

    def _prefetch(self, positions, default):
        """Start async gathers for the units at ``positions`` (in order) while the budget lasts;
        returns the position after the last unit considered (forward) or the last one started."""
        budget = self.zero.stage3_prefetch_bucket_size - sum(
            self.plan.numel(k) for k in self.store.work)
        reached = default
        for i in positions:
            keys = [k for k in self.plan.fetch[self.trace[i]]
                    if self.store.state[k] == RELEASED]
            need = sum(self.plan.numel(k) for k in keys)
            if need > budget or self.store.gathered_numel() + need > \
                    self.zero.stage3_max_live_parameters:
                break
            for k in keys:
                self.store.gather(k, async_op=True)
            budget -= need
            reached = i + 1 if default is not None else i
        return reached
