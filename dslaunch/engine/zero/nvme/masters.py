"""The fp32 master shard swapped to a file, next to the optimizer states.

With ``swap_params`` the swapped optimizer's parameters (views of the strategy's fp32 master
shard) live in ``fp32_master.swp`` in the rank's swap directory, laid out in the same sub-groups as
the states and moved through a second set of buffers. Between steps they are CPU tensors without
storage (``storageless_like``). They are written to the file when the strategy is built; after the
step the strategy reads the new values back sub-group by sub-group (``iter_params``: one more read
of the file per step, no more memory than the buffers). Whatever else reads or writes the masters
does it between ``load_params`` and ``store_params`` (the strategy's ``masters_in``,
``strategy.py``).
"""

from __future__ import annotations

import torch

from dslaunch.engine.zero.nvme.swap_file import round_up


class SwappedMasters:
    """Mixed into ``NVMeSwappedOptimizer`` (``optimizer.py``), which provides ``subgroups``,
    ``io``, ``stats``, ``master_path``, ``master_buffers``, ``_lay_out_file`` and ``_wait``."""

    def _adopt_params(self) -> None:
        """Write the parameters' values to their own file and leave them storage-less."""
        plan, self.master_file_bytes, self.master_buffers = self._lay_out_file(
            lambda p: round_up(p.numel() * p.element_size()), self.master_path)
        for sg, (start, offsets, nbytes) in zip(self.subgroups, plan):
            sg.m_offset, sg.m_nbytes = start, nbytes
            sg.m_offsets.update(offsets)
        self.store_params()
        self.park_params()

    def _mview(self, sg, slot: int, p):
        at = sg.m_offsets[p]
        return self.master_buffers[slot][at: at + p.numel() * p.element_size()].view(
            p.dtype).view(p.shape)

    def _read_params(self, i: int, slot: int, sync: bool = False) -> None:
        """Point sub-group ``i``'s parameters at buffer ``slot`` and read their values into it."""
        sg = self.subgroups[i]
        for p in sg.params:
            p.data = self._mview(sg, slot, p)
        (self.io.sync_pread if sync else self.io.async_pread)(
            self.master_buffers[slot][: sg.m_nbytes], self.master_path, sg.m_offset)
        self.stats["master_read_bytes"] += sg.m_nbytes

    def _write_params(self, i: int, slot: int, sync: bool = False) -> None:
        sg = self.subgroups[i]
        (self.io.sync_pwrite if sync else self.io.async_pwrite)(
            self.master_buffers[slot][: sg.m_nbytes], self.master_path, sg.m_offset)
        self.stats["master_write_bytes"] += sg.m_nbytes
        for p in sg.params:
            p.data = storageless_like(p)

    def load_params(self) -> None:
        """Read every parameter's values from the file into the memory its ``.data`` is now
        (the caller gave each parameter ordinary storage first)."""
        for sg in self.subgroups:
            self.io.sync_pread(self.master_buffers[0][: sg.m_nbytes], self.master_path,
                               sg.m_offset)
            self.stats["master_read_bytes"] += sg.m_nbytes
            for p in sg.params:
                p.data.copy_(self._mview(sg, 0, p))

    def store_params(self) -> None:
        """Write every parameter's current values (ordinary storage) to the file."""
        for sg in self.subgroups:
            for p in sg.params:
                self._mview(sg, 0, p).copy_(p.data)
            self.io.sync_pwrite(self.master_buffers[0][: sg.m_nbytes], self.master_path,
                                sg.m_offset)
            self.stats["master_write_bytes"] += sg.m_nbytes

    def park_params(self) -> None:
        """Every parameter storage-less (its values are in the file)."""
        for sg in self.subgroups:
            for p in sg.params:
                p.data = storageless_like(p)

    def iter_params(self):
        """Each parameter in order, with its values readable (a view of a swap buffer) while
        the caller holds it; the next sub-group is read ahead. Read-only."""
        n, slots = len(self.subgroups), len(self.master_buffers)
        self._read_params(0, 0, sync=True)
        try:
            for i, sg in enumerate(self.subgroups):
                if i + 1 < n and slots > 1:
                    self._read_params(i + 1, (i + 1) % slots)
                for p in sg.params:
                    yield p
                if i + 1 < n and slots > 1:
                    self._wait()
                for p in sg.params:
                    p.data = storageless_like(p)
                if i + 1 < n and slots == 1:
                    self._read_params(i + 1, 0, sync=True)
        finally:
            self._wait()
            self.park_params()


def storageless_like(p) -> torch.Tensor:
    """A CPU tensor shaped like ``p`` with no storage: the parameter keeps its device, dtype and
    shape (gradients can be assigned to it) while its values are in the file."""
    t = torch.empty(p.shape, dtype=p.dtype)
    t.untyped_storage().resize_(0)
    return t
