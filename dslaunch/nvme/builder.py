"""DeepSpeed's ``AsyncIOBuilder``: builds (or finds in the cache) the ``async_io`` op, and its
``load()`` gives ``dslaunch.nvme.aio``, whose ``aio_handle(...)`` is the handle DeepNVMe code
creates. The other builders are ``dslaunch/kernels/op_builder.py``'s; the table
(``deepspeed.ops.op_builder.*`` rows) is where the accelerator and the face find this one."""

from __future__ import annotations

from dslaunch.kernels.op_builder import builder_class


class AsyncIOBuilder(builder_class("AsyncIOBuilder")):
    def load(self, verbose: bool = True):
        super().load(verbose)  # build errors surface here, as DeepSpeed's load raises them
        from dslaunch.nvme import aio

        return aio
