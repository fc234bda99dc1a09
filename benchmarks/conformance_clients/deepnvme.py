"""DeepSpeed's docs/_tutorials/deepnvme.md, the Python session it types with a CPU tensor (no
.cuda()) and a temporary directory instead of /local_nvme, 4 MiB instead of 1 GiB:
``AsyncIOBuilder().load().aio_handle()``, ``sync_pwrite``, ``async_pwrite`` + ``wait()``,
``sync_pread`` back, and a check that the bytes read equal the bytes written."""

import os
import tempfile

import torch
from deepspeed.ops.op_builder import AsyncIOBuilder

d = tempfile.mkdtemp()
t = torch.randint(0, 255, (4 * 1024**2,), dtype=torch.uint8)
h = AsyncIOBuilder().load().aio_handle()
path = os.path.join(d, "test_4MB.pt")
print("isfile before", os.path.isfile(path))
h.sync_pwrite(t, path)
print("isfile after sync_pwrite", os.path.isfile(path), os.path.getsize(path))
path2 = os.path.join(d, "test_4MB_async.pt")
h.async_pwrite(t, path2)
print("wait ->", h.wait())
print("size after async_pwrite", os.path.getsize(path2))
back = torch.empty_like(t)
h.sync_pread(back, path2)
assert torch.equal(back, t), "read back differs"
print("read back equal: True")
