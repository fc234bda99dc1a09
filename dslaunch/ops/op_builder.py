"""``dslaunch.ops.op_builder``, as ``deepspeed.ops.op_builder``: DeepSpeed's builder classes by
name, so DeepNVMe code runs as its tutorial types it::

    from deepspeed.ops.op_builder import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle(block_size, queue_depth, single_submit,
                                           overlap_events, intra_op_parallelism)

Each builder has ``NAME``, ``absolute_name()``, ``is_compatible()`` and ``load()``; ``load()``
builds dslaunch's op (cached) and returns it: ``AsyncIOBuilder`` gives ``dslaunch.nvme.aio``
(``aio_handle``), ``PinMemoryBuilder`` ``dslaunch.nvme.pinned`` (``pin_handle``), the
optimizer builders the compiled op of ``dslaunch.kernels``. Builders with no dslaunch op
(``GDSBuilder``, ``FusedLambBuilder``, ``FusedLionBuilder``) import, answer
``is_compatible() == False`` and say on ``load()`` what to use instead.

A face: the builders are ``dslaunch/kernels/op_builder.py``'s and ``dslaunch/nvme/builder.py``'s
(the same classes ``get_accelerator().get_op_builder(name)`` hands out).
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.kernels.op_builder import builder_class
from dslaunch.nvme.builder import AsyncIOBuilder, PinMemoryBuilder

GDSBuilder = builder_class("GDSBuilder")
CPUAdamBuilder = builder_class("CPUAdamBuilder")
CPUAdagradBuilder = builder_class("CPUAdagradBuilder")
CPULionBuilder = builder_class("CPULionBuilder")
FusedAdamBuilder = builder_class("FusedAdamBuilder")
FusedLambBuilder = builder_class("FusedLambBuilder")
FusedLionBuilder = builder_class("FusedLionBuilder")

__all__ = ["AsyncIOBuilder", "PinMemoryBuilder", "GDSBuilder", "CPUAdamBuilder", "CPUAdagradBuilder",
           "CPULionBuilder", "FusedAdamBuilder", "FusedLambBuilder", "FusedLionBuilder"]

__getattr__ = face_getattr(__name__)  # another DeepSpeed builder: says it is not provided
