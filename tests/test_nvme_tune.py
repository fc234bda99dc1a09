"""``dslaunch nvme-tune`` end to end through the console script, on real directories: a tiny sweep
(JSON shape, best config valid for the `aio` section, files removed), the refusals (missing dir,
a file, a read-only mount, a full tmpfs mount, bad sweep files) and files removed after SIGINT /
SIGTERM in the middle of a sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dslaunch.config import resolve_config
from dslaunch.nvme import tune
from helpers import DSLAUNCH

KEYS = ["block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"]


def run_tune(*args, timeout=240):
    return subprocess.run([*DSLAUNCH, "nvme-tune", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"block_size": ["64K", "256K"], "queue_depth": [2, 8],
                                "io_parallel": [1, 2], "single_submit": [False],
                                "overlap_events": [True, False]}))
    return path


@pytest.fixture
def mount_point():
    """A temporary directory to mount on; unmounted (if mounted) and removed afterwards."""
    d = tempfile.mkdtemp(prefix="dsl-tune-mnt.")
    yield Path(d)
    subprocess.run(["umount", d], capture_output=True)
    os.rmdir(d)


def _mount(*args):
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")


def test_tiny_sweep_json(tmp_path, sweep_file):
    target = tmp_path / "nvme"
    target.mkdir()
    r = run_tune("--nvme-dir", target, "--io-size", "2M", "--sweep-config", sweep_file, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"io_size", "backend", "dirs", "results", "best", "aio"}
    assert out["io_size"] == 2 << 20 and out["backend"] in ("linux-aio", "threads")
    assert out["dirs"] == [{"path": str(target.resolve()), "bytes": 2 << 20, "io_mode": "O_DIRECT"}]
    assert len(out["results"]) == 2 * 2 * 2 * 1 * 2 * 2  # settings x (read, write)
    assert {r["op"] for r in out["results"]} == {"read", "write"}
    assert all(r["gbps"] > 0 and len(r["seconds"]) == 1 for r in out["results"])
    assert {r["block_size"] for r in out["results"]} == {65536, 262144}
    for op in ("read", "write"):
        best = out["best"][op]
        assert best["gbps"] == max(r["gbps"] for r in out["results"] if r["op"] == op)
    assert list(out["aio"]) == KEYS + ["use_gds"] and out["aio"]["use_gds"] is False
    cfg = resolve_config({"train_micro_batch_size_per_gpu": 1, "aio": out["aio"]}, world_size=1)
    assert cfg.get("aio.block_size") == out["aio"]["block_size"]
    assert list(target.iterdir()) == []  # its files are gone


def test_human_output_two_dirs_write_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    sweep = tmp_path / "s.yaml"
    sweep.write_text("block_size: [128K]\nqueue_depth: [4, 8]\n")
    r = run_tune("--nvme-dir", a, b, "--io-size", "3M", "--sweep-config", sweep, "--no-read",
                 "--loops", "2")
    assert r.returncode == 0, r.stderr
    assert "best write:" in r.stdout and "best read:" not in r.stdout
    assert f"{a.resolve()}: 1572864 bytes per trial, O_DIRECT" in r.stdout
    section = json.loads(r.stdout[r.stdout.index('{\n  "aio"'):])["aio"]
    assert section["block_size"] == 131072 and section["queue_depth"] in (4, 8)
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []


def test_refuses_missing_dir_and_file(tmp_path, sweep_file):
    r = run_tune("--nvme-dir", tmp_path / "nope", "--io-size", "1M", "--sweep-config", sweep_file)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"Error: --nvme-dir {tmp_path / 'nope'}: does not exist"]
    f = tmp_path / "file"
    f.write_text("x")
    r = run_tune("--nvme-dir", f, "--io-size", "1M", "--sweep-config", sweep_file)
    assert r.returncode == 1 and "not a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "sweep.json"]


def test_refuses_read_only_mount(tmp_path, mount_point, sweep_file):
    """Root may write anywhere the permissions say no, but not on a read-only mount."""
    src = tmp_path / "src"
    src.mkdir()
    _mount("--bind", str(src), str(mount_point))
    _mount("-o", "remount,ro,bind", str(mount_point))
    r = run_tune("--nvme-dir", mount_point, "--io-size", "1M", "--sweep-config", sweep_file)
    assert r.returncode == 1, r.stdout
    assert f"--nvme-dir {mount_point}: not writable (Read-only file system)" in r.stderr
    assert list(src.iterdir()) == []


def test_refuses_too_little_space(mount_point, sweep_file):
    _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point))
    r = run_tune("--nvme-dir", mount_point, "--io-size", "4M", "--sweep-config", sweep_file)
    assert r.returncode == 1
    assert f"--nvme-dir {mount_point}: needs 4M (4194304 bytes) for --io-size" in r.stderr
    assert list(mount_point.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    ('{"block_sise": [4096]}', "unknown key 'block_sise' (did you mean 'block_size'?)"),
    ('{"block_size": [1000]}', "block_size: 1000 is not a multiple of 4096"),
    ('{"queue_depth": [0]}', "queue_depth: expected an integer >= 1, got 0"),
    ('{"single_submit": ["yes"]}', "single_submit: expected true/false"),
    ("[1, 2]", "expected an object of lists"),
    ("{oops", "not valid JSON/YAML"),
])
def test_refuses_bad_sweep_config(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    r = run_tune("--nvme-dir", tmp_path, "--io-size", "1M", "--sweep-config", bad)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_usage_errors(tmp_path):
    r = run_tune("--nvme-dir", tmp_path, "--no-read", "--no-write")
    assert r.returncode == 2 and "nothing to measure" in r.stderr
    r = run_tune("--nvme-dir", tmp_path, "--io-size", "lots")
    assert r.returncode == 1 and "'lots' is not a size" in r.stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_sweep_removes_its_files(tmp_path, sig, code):
    target = tmp_path / "nvme"
    target.mkdir()
    sweep = tmp_path / "long.json"  # 4 x 4 x 2 x 2 x 2 = 128 settings x 2 ops: minutes
    sweep.write_text(json.dumps({"block_size": ["64K", "128K", "256K", "512K"],
                                 "queue_depth": [1, 2, 4, 8], "io_parallel": [1, 2],
                                 "single_submit": [True, False], "overlap_events": [True, False]}))
    proc = subprocess.Popen([*DSLAUNCH, "nvme-tune", "--nvme-dir", str(target), "--io-size", "32M",
                             "--sweep-config", str(sweep), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a suite started in the background (nohup, &)
                            # hands its children SIGINT ignored, and Python keeps it ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        data = None
        while time.time() < deadline and proc.poll() is None:
            found = list(target.glob(f"{tune.WORKDIR_PREFIX}*/data.bin"))
            if found and found[0].stat().st_size == 32 << 20:
                data = found[0]
                break
            time.sleep(0.05)
        assert data is not None, "the sweep never wrote its data file"
        time.sleep(0.5)  # into the timed trials
        assert proc.poll() is None, "the sweep ended before the signal"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert "its files were removed" in err and out == ""
    assert list(target.iterdir()) == []


def test_parse_size_and_grid():
    assert tune.parse_size("128K") == 131072 and tune.parse_size("1G") == 1 << 30
    assert tune.parse_size(4096) == 4096 and tune.parse_size("1.5M") == 1572864
    for bad in ["0", "-1", "12Q", True]:
        with pytest.raises(tune.TuneError):
            tune.parse_size(bad)
    assert len(tune.grid(tune.DEFAULT_SWEEP)) == 144
    sweep = tune.normalize_sweep({"thread_count": [2, 2, 4]})
    assert sweep["intra_op_parallelism"] == [2, 4] and sweep["block_size"] == [1048576]


def test_ds_nvme_tune_flags(tmp_path):
    """DeepSpeed's ds_nvme_tune command line as typed (underscored flags, --nvme_dir with two
    directories after it, --verbose, --log_dir, --flush_page_cache), same meaning."""
    a, b, logs = tmp_path / "a", tmp_path / "b", tmp_path / "logs"
    a.mkdir(), b.mkdir()
    sweep = tmp_path / "s.json"
    sweep.write_text(json.dumps({"block_size": ["128K"], "queue_depth": [4, 8],
                                 "io_parallel": [1], "single_submit": [False],
                                 "overlap_events": [True]}))
    r = run_tune("--nvme_dir", a, b, "--io_size", "1M", "--sweep_config", sweep, "--loops", 2,
                 "--verbose", "--log_dir", logs, "--flush_page_cache", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [d["path"] for d in out["dirs"]] == [str(a.resolve()), str(b.resolve())]
    assert out["io_size"] == 1 << 20 and out["loops"] == 2
    assert {(x["op"], x["queue_depth"]) for x in out["results"]} == {
        (op, qd) for op in ("read", "write") for qd in (4, 8)}
    runs = (logs / "nvme_tune_runs.log").read_text().splitlines()
    assert len(runs) == 2 * 2 * 2 and all("GB/s" in line for line in runs)
    assert "[8/8] read block_size=131072 queue_depth=8" in r.stderr  # --verbose: every run
    assert json.loads((logs / "nvme_tune.json").read_text()) == out
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []

    r = run_tune("--nvme_dir", a, "--io_size", "256K", "--sweep_config", sweep, "--no_read",
                 "--json")
    assert r.returncode == 0, r.stderr
    assert {x["op"] for x in json.loads(r.stdout)["results"]} == {"write"}
    r = run_tune("--nvme_dir", a, "--no_read", "--no_write")
    assert r.returncode != 0 and "nothing to measure" in r.stderr
    for flag in ("--gpu", "--gds"):
        r = run_tune("--nvme_dir", a, flag)
        assert r.returncode != 0 and "host (CPU) memory" in r.stderr, r.stderr


def _resident_pages(path) -> int:
    """Pages of the file in the page cache (mincore(2) over a read-only shared mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def test_flush_page_cache_evicts_the_files(tmp_path):
    """--flush_page_cache: after drop_cached_pages the test file's pages are out of the page
    cache, where a plain read had put them (on a disk file system; tmpfs keeps them)."""
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1 << 20))
    path.read_bytes()
    if _resident_pages(path) == 0:
        pytest.skip("the file system does not cache this file")
    sweep = tune.Sweep([tune.Target(tmp_path, 1 << 20, workdir=tmp_path)], 1 << 20, [])
    sweep.drop_cached_pages()
    assert _resident_pages(path) == 0
