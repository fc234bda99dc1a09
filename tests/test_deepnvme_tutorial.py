"""DeepNVMe as DeepSpeed's tutorial (docs/_tutorials/deepnvme.md) and DeepSpeedExamples'
deepnvme/file_access scripts type it: ``from deepspeed.ops.op_builder import AsyncIOBuilder``,
``AsyncIOBuilder().load().aio_handle(...)``, then the handle's calls, on real files; bytes
checked with plain Python reads. Under ``DSLAUNCH_AS_DEEPSPEED`` (an unmodified script) and with
``import dslaunch as deepspeed``. Plus the builders' surface (NAME, absolute_name, is_compatible,
the accelerator's class) and the builders dslaunch has no op for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

TUTORIAL = r'''
import os, sys
import torch
import deepspeed
from deepspeed.ops.op_builder import AsyncIOBuilder
from deepspeed.accelerator import get_accelerator

d = sys.argv[1]
n = 3 * 1024 * 1024 + 4096 + 17          # not a multiple of the block or the page
src = torch.arange(n, dtype=torch.int64).remainder(251).to(torch.uint8)

# "Advanced handle creation": positional, as the tutorial's constructor order
h = AsyncIOBuilder().load().aio_handle(1048576, 8, False, True, 2)
assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
        h.get_intra_op_parallelism()) == (1048576, 8, False, True, 2)

# Blocking write, then non-blocking write + wait (the tutorial's 1 completed op)
h.sync_pwrite(src, os.path.join(d, "sync.pt"))
assert h.async_pwrite(src, os.path.join(d, "async.pt")) == 0
assert h.wait() == 1

# aio_store_cpu_tensor.py / aio_load_cpu_tensor.py: a locked bounce buffer on a CPU accelerator
native_locked_tensor = get_accelerator()._name == "cpu"
if native_locked_tensor:
    bounce = h.new_cpu_locked_tensor(n, torch.Tensor().to(torch.uint8))
    back = h.new_cpu_locked_tensor(n, torch.Tensor().to(torch.uint8))
else:
    bounce = torch.empty(n, dtype=torch.uint8).pin_memory()
    back = torch.empty(n, dtype=torch.uint8).pin_memory()
    assert h.is_pinned(back)
bounce.copy_(src)
h.sync_pwrite(bounce, os.path.join(d, "bounce.pt"))
h.sync_pread(back, os.path.join(d, "bounce.pt"))
assert back.equal(src)
if native_locked_tensor:
    assert h.free_cpu_locked_tensor(bounce) and not h.free_cpu_locked_tensor(src)

# pread / pwrite with validate and DeepSpeed's `async` keyword; read / write; an fd target
dst = torch.zeros(n, dtype=torch.uint8)
assert h.pread(dst, os.path.join(d, "async.pt"), True, False) == 1 and dst.equal(src)
dst.zero_()
assert h.pread(dst, os.path.join(d, "sync.pt"), False, **{"async": True}) == 0
assert h.wait() == 1 and dst.equal(src)
assert h.pwrite(src[:8192], os.path.join(d, "off.pt"), True, False, file_offset=4096) == 1
assert h.write(src, os.path.join(d, "plain.pt"), True) == 0
dst.zero_()
assert h.read(dst, os.path.join(d, "plain.pt"), True) == 0 and dst.equal(src)
fd = os.open(os.path.join(d, "fd.pt"), os.O_WRONLY | os.O_CREAT, 0o644)
assert h.async_pwrite(src, fd) == 0 and h.wait() == 1
os.close(fd)

# "Pinned Tensors": the standalone pin_memory op; its buffers are the handles' too
from deepspeed.ops.op_builder import PinMemoryBuilder
pin = PinMemoryBuilder().load().pin_handle()
t = pin.new_cpu_locked_tensor(1024**2, torch.empty(0, dtype=torch.uint8))
assert pin.is_pinned(t) and h.is_pinned(t) and t.data_ptr() % 4096 == 0
t.copy_(src[:1024**2])
h.sync_pwrite(t, os.path.join(d, "pinned.pt"))
assert pin.free_cpu_locked_tensor(t) is True and pin.free_cpu_locked_tensor(t) is False
assert not pin.is_pinned(torch.empty(16, dtype=torch.uint8))
print("tutorial ok", type(h).__module__)
'''


def _check_files(d, n=3 * 1024 * 1024 + 4096 + 17):
    expect = bytes(i % 251 for i in range(n))
    for name in ("sync.pt", "async.pt", "bounce.pt", "plain.pt", "fd.pt"):
        with open(os.path.join(d, name), "rb") as f:
            assert f.read() == expect, name
    with open(os.path.join(d, "off.pt"), "rb") as f:
        assert f.read() == b"\0" * 4096 + expect[:8192]
    with open(os.path.join(d, "pinned.pt"), "rb") as f:
        assert f.read() == expect[:1024**2]


def test_tutorial_unmodified_under_the_alias(tmp_path):
    env = {**os.environ, "DSLAUNCH_AS_DEEPSPEED": "1"}
    r = subprocess.run([sys.executable, "-c", TUTORIAL, str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "tutorial ok dslaunch.nvme.aio" in r.stdout
    _check_files(tmp_path)


def test_tutorial_with_import_dslaunch_as_deepspeed(tmp_path):
    code = TUTORIAL.replace("import deepspeed\n", "import dslaunch as deepspeed\n").replace(
        "from deepspeed.", "from dslaunch.")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    _check_files(tmp_path)


def test_validate_reports_a_difference(tmp_path):
    from dslaunch.nvme import aio

    path = tmp_path / "v.bin"
    path.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(OSError, match="differ from byte 5"):
        other = torch.arange(4096, dtype=torch.int64).remainder(256).to(torch.uint8)
        other[5] = 0
        aio._validate(True, other, str(path), 0)


def test_builders_surface():
    from dslaunch.accelerator import get_accelerator
    from dslaunch.kernels.builder import OpUnavailable
    from dslaunch.ops import op_builder

    b = op_builder.AsyncIOBuilder()
    assert b.NAME == "async_io" and b.absolute_name() == "dslaunch.kernels.async_io"
    assert b.is_compatible() is True
    assert get_accelerator().get_op_builder("AsyncIOBuilder") is op_builder.AsyncIOBuilder
    assert get_accelerator().get_op_builder("PinMemoryBuilder") is op_builder.PinMemoryBuilder
    assert op_builder.PinMemoryBuilder().is_compatible() and op_builder.PinMemoryBuilder.NAME == (
        "pin_memory")
    assert b.load().aio_handle is b.load().AsyncIOHandle
    cpu_adam = op_builder.CPUAdamBuilder()
    assert cpu_adam.NAME == "cpu_adam" and cpu_adam.is_compatible()
    assert cpu_adam.load(verbose=False) is get_accelerator().create_op_builder(
        "CPUAdamBuilder").load(verbose=False)
    if not torch.cuda.is_available():
        assert op_builder.FusedAdamBuilder().is_compatible() is False
    for name, hint in (("GDSBuilder", "AsyncIOBuilder"), ("FusedLambBuilder", "FusedLamb"),
                       ("FusedLionBuilder", "FusedLion")):
        cls = getattr(op_builder, name)
        assert cls().is_compatible() is False
        with pytest.raises(OpUnavailable, match=hint):
            cls().load()
    with pytest.raises(AttributeError, match="deepspeed.ops.op_builder.TransformerBuilder"):
        op_builder.TransformerBuilder  # noqa: B018
