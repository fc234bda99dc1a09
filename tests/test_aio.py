"""The async I/O op (cpp/aio + dslaunch/nvme/aio.py) on real files: read-back equality, O_DIRECT
where the file system allows it, the buffered fallback where it does not (a ramfs mount), both
backends, the thread split, errors."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from dslaunch.nvme import aio

REPO = Path(__file__).resolve().parents[1]
SIZES = [1, 4095, 4096, (1 << 20) + 7]
MiB = 1 << 20


def _random_bytes(n, seed=0):
    g = torch.Generator().manual_seed(seed + n)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


@pytest.fixture(scope="module")
def engine():
    return aio.load_engine()


@pytest.fixture
def disk_dir(tmp_path):
    """A directory on the checkout's file system (ext4 here: O_DIRECT allowed)."""
    if os.stat(tmp_path).st_dev != os.stat(REPO).st_dev:
        d = Path(tempfile.mkdtemp(prefix=".test_aio.", dir=REPO))
        yield d
        subprocess.run(["rm", "-rf", str(d)], check=True)
    else:
        yield tmp_path


@pytest.fixture
def ramfs_dir():
    """A fresh ramfs mount: a file system that refuses O_DIRECT (tmpfs accepts it since Linux
    6.6, so /dev/shm is no longer such a case)."""
    d = tempfile.mkdtemp(prefix="dsl-ramfs.")
    r = subprocess.run(["mount", "-t", "ramfs", "ramfs", d], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"cannot mount ramfs here: {r.stderr.strip()}")
    try:
        yield Path(d)
    finally:
        subprocess.run(["umount", d], check=True)
        os.rmdir(d)


def _roundtrip(h, n, path, async_op):
    src = _random_bytes(n)
    dst = torch.zeros(n, dtype=torch.uint8)
    if async_op:
        assert h.async_pwrite(src, path) == 0
        assert h.wait() == 1
        assert h.async_pread(dst, path) == 0
        assert h.wait() == 1
    else:
        assert h.sync_pwrite(src, path) == 1
        assert h.sync_pread(dst, path) == 1
    assert os.path.getsize(path) == n
    assert Path(path).read_bytes() == src.numpy().tobytes()  # an independent reader agrees
    assert torch.equal(src, dst)


@pytest.mark.parametrize("backend", ["linux-aio", "threads"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_roundtrip_sizes(disk_dir, backend, threads, async_op):
    with aio.AsyncIOHandle(block_size=64 * 1024, queue_depth=4, intra_op_parallelism=threads,
                           backend=backend) as h:
        assert h.backend == backend
        for n in SIZES:
            _roundtrip(h, n, disk_dir / f"f{n}.bin", async_op)


@pytest.mark.parametrize("single_submit", [False, True])
@pytest.mark.parametrize("overlap_events", [False, True])
def test_submit_modes(disk_dir, single_submit, overlap_events):
    with aio.AsyncIOHandle(block_size=16 * 1024, queue_depth=8, single_submit=single_submit,
                           overlap_events=overlap_events, intra_op_parallelism=2) as h:
        _roundtrip(h, 3 * MiB + 12345, disk_dir / "m.bin", async_op=True)
        assert h.stats()["direct_bytes"] > 0


def test_direct_io_on_checkout_fs_aligned_buffer(disk_dir):
    n = MiB + 7
    with aio.AsyncIOHandle(block_size=256 * 1024, queue_depth=4, intra_op_parallelism=2) as h:
        assert aio.probe_direct(disk_dir) == (True, "")
        assert h.io_mode(disk_dir) == "O_DIRECT"
        buf = h.new_cpu_locked_tensor(n, torch.uint8)
        assert buf.data_ptr() % aio.ALIGN == 0 and buf.numel() == n
        buf.copy_(_random_bytes(n))
        h.sync_pwrite(buf, disk_dir / "a.bin")
        back = h.new_cpu_locked_tensor(n, buf)
        h.sync_pread(back, disk_dir / "a.bin")
        assert torch.equal(buf, back)
        s = h.stats()
        # aligned part with O_DIRECT, the 7-byte tail buffered, no bounce (buffer is aligned)
        assert s["direct_bytes"] == 2 * MiB and s["buffered_bytes"] == 2 * 7
        assert s["bounce_bytes"] == 0 and s["ops"] == 2
        assert h.free_cpu_locked_tensor(buf) and not h.free_cpu_locked_tensor(buf)
        assert h.free_cpu_locked_tensor(back)


def test_unaligned_buffer_goes_through_bounce(disk_dir):
    n = 2 * MiB
    storage = _random_bytes(n + 1)
    src = storage[1:]  # data_ptr is 1 byte past an allocation: not 4 KiB aligned
    assert src.data_ptr() % aio.ALIGN != 0
    with aio.AsyncIOHandle(block_size=128 * 1024, queue_depth=4, intra_op_parallelism=2) as h:
        h.sync_pwrite(src, disk_dir / "u.bin")
        dst_storage = torch.zeros(n + 3, dtype=torch.uint8)
        dst = dst_storage[3:]
        h.sync_pread(dst, disk_dir / "u.bin")
        assert torch.equal(src, dst)
        s = h.stats()
        assert s["direct_bytes"] == 2 * n and s["bounce_bytes"] == 2 * n


def test_buffered_fallback_where_o_direct_is_refused(ramfs_dir):
    ok, why = aio.probe_direct(ramfs_dir)
    assert not ok and "O_DIRECT" in why
    with aio.AsyncIOHandle(block_size=64 * 1024, intra_op_parallelism=2) as h:
        assert h.io_mode(ramfs_dir).startswith("buffered")
        for n in SIZES:
            _roundtrip(h, n, ramfs_dir / f"r{n}.bin", async_op=n % 2 == 0)
        s = h.stats()
        assert s["direct_bytes"] == 0 and s["buffered_bytes"] == 2 * sum(SIZES)


def test_dev_shm_uses_what_the_probe_says():
    """/dev/shm is tmpfs: O_DIRECT is refused before Linux 6.6 and accepted since; either way the
    handle's byte accounting must follow the probe and the data must round-trip."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="dsl-aio.", dir="/dev/shm"))
    try:
        ok, _ = aio.probe_direct(d)
        with aio.AsyncIOHandle(block_size=64 * 1024, intra_op_parallelism=2) as h:
            for n in SIZES:
                _roundtrip(h, n, d / f"s{n}.bin", async_op=True)
            s = h.stats()
            aligned = 2 * sum(n // 4096 * 4096 for n in SIZES)
            assert s["direct_bytes"] == (aligned if ok else 0)
            assert s["direct_bytes"] + s["buffered_bytes"] == 2 * sum(SIZES)
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=True)


def test_several_async_ops_in_flight(disk_dir):
    with aio.AsyncIOHandle(block_size=64 * 1024, queue_depth=8, intra_op_parallelism=3) as h:
        srcs = [_random_bytes(MiB + i, seed=i) for i in range(5)]
        for i, s in enumerate(srcs):
            h.pwrite(s, disk_dir / f"x{i}.bin", async_op=True)
        assert h.pending() == 5
        assert h.wait() == 5
        assert h.pending() == 0 and h.wait() == 0
        dsts = [torch.zeros_like(s) for s in srcs]
        for i, d in enumerate(dsts):
            h.pread(d, disk_dir / f"x{i}.bin", async_op=True)
        assert h.wait() == 5
        assert all(torch.equal(s, d) for s, d in zip(srcs, dsts))


def test_ops_are_split_over_threads(disk_dir):
    """One 1 MiB op with block_size 1 MiB: one block request with 1 thread, one per thread with 4
    (each thread gets a 256 KiB page-aligned chunk)."""
    buf = _random_bytes(MiB)
    for threads, requests in [(1, 1), (4, 4)]:
        with aio.AsyncIOHandle(block_size=MiB, intra_op_parallelism=threads) as h:
            h.sync_pwrite(buf, disk_dir / "t.bin")
            assert h.stats()["requests"] == requests


def test_offsets_and_dtypes(disk_dir):
    with aio.AsyncIOHandle(block_size=64 * 1024) as h:
        a = torch.arange(3000, dtype=torch.float32)
        b = torch.arange(5000, dtype=torch.bfloat16)
        h.sync_pwrite(a, disk_dir / "o.bin", file_offset=0)
        h.sync_pwrite(b, disk_dir / "o.bin", file_offset=16384)
        a2, b2 = torch.empty_like(a), torch.empty_like(b)
        h.sync_pread(b2, disk_dir / "o.bin", file_offset=16384)
        h.sync_pread(a2, disk_dir / "o.bin")
        assert torch.equal(a, a2) and torch.equal(b, b2)


def test_kernel_aio_unavailable_falls_back_to_threads(disk_dir):
    """io_setup fails when asked for more events than fs.aio-max-nr: 'auto' falls back to the
    thread pool and says why; an explicit 'linux-aio' refuses."""
    too_many = int(Path("/proc/sys/fs/aio-max-nr").read_text()) + 1
    with aio.AsyncIOHandle(block_size=64 * 1024, queue_depth=too_many) as h:
        assert h.backend == "threads" and "io_setup" in h.backend_note
        _roundtrip(h, MiB + 7, disk_dir / "fb.bin", async_op=True)
    with pytest.raises(OSError, match="io_setup"):
        aio.AsyncIOHandle(queue_depth=too_many, backend="linux-aio")


def test_backend_from_environment(monkeypatch):
    monkeypatch.setenv("DSLAUNCH_AIO_BACKEND", "threads")
    with aio.AsyncIOHandle() as h:
        assert h.backend == "threads" and h.backend_note == "requested"


def test_errors(disk_dir):
    with aio.AsyncIOHandle(block_size=64 * 1024) as h:
        t = torch.zeros(100, dtype=torch.uint8)
        with pytest.raises(OSError, match="missing.bin: cannot open"):
            h.sync_pread(t, disk_dir / "missing.bin")
        with pytest.raises(OSError, match="missing.bin"):
            h.async_pread(t, disk_dir / "missing.bin")
        (disk_dir / "short.bin").write_bytes(b"x" * 50)
        with pytest.raises(OSError, match="holds 50 bytes"):
            h.sync_pread(t, disk_dir / "short.bin")
        with pytest.raises(OSError, match="cannot open for writing"):
            h.sync_pwrite(t, disk_dir / "no" / "such" / "dir.bin")
        with pytest.raises(ValueError, match="contiguous"):
            h.sync_pwrite(torch.zeros(10, 10)[:, 1], disk_dir / "nc.bin")
        with pytest.raises(TypeError):
            h.sync_pwrite(b"bytes", disk_dir / "b.bin")
        assert h.pending() == 0 and h.wait() == 0
    for bad in [dict(block_size=1000), dict(block_size=0), dict(queue_depth=0),
                dict(intra_op_parallelism=0), dict(backend="io_uring")]:
        with pytest.raises(ValueError):
            aio.AsyncIOHandle(**bad)


def test_report_status(engine):
    st = aio.report_status()
    assert st["built"] is True
    assert st["backend"] == "linux-aio", st
