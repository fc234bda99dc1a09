"""DeepSpeed's ``AsyncIOBuilder``: builds (or finds in the cache) the ``async_io`` op, and its
``load()`` gives ``dslaunch.nvme.aio``, whose ``aio_handle(...)`` is the handle DeepNVMe code
creates; and ``PinMemoryBuilder`` (``load().pin_handle()``). The other builders are
``dslaunch/kernels/op_builder.py``'s; the table (``deepspeed.ops.op_builder.*`` rows) is where
the accelerator and the face find these two."""

from __future__ import annotations

import sys

from dslaunch.kernels.op_builder import OpBuilder, builder_class


class AsyncIOBuilder(builder_class("AsyncIOBuilder")):
    def load(self, verbose: bool = True):
        super().load(verbose)  # build errors surface here, as DeepSpeed's load raises them
        from dslaunch.nvme import aio

        return aio


class PinMemoryBuilder(OpBuilder):
    """DeepSpeed's ``PinMemoryBuilder``: ``load().pin_handle()`` allocates page-aligned, locked
    host tensors (``dslaunch.nvme.pinned``, plain Python over mlock(2): nothing to compile)."""

    NAME = "pin_memory"
    KIND = "cpu"

    def absolute_name(self) -> str:
        return "dslaunch.nvme.pinned"

    def sources(self) -> list[str]:
        return []

    def is_compatible(self, verbose: bool = False) -> bool:
        return sys.platform.startswith("linux")

    def load(self, verbose: bool = True):
        from dslaunch.nvme import pinned

        return pinned
