"""The op builder: prebuild, cache reuse across processes, one build under concurrency, stale-lock
take-over, clear failures with a torch fallback. Real compiles into temporary cache directories.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dslaunch.kernels import builder
from dslaunch.kernels.build_lock import BuildLock, LockTimeout

REPO = Path(__file__).resolve().parents[1]


def _run(code, env_extra, timeout=300):
    env = dict(os.environ, **env_extra)
    env.pop("DSLAUNCH_SIMD", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def _builds(cache: Path, op: str) -> list[dict]:
    dirs = [d for d in cache.glob(f"{op}-*") if d.is_dir()]
    lines = []
    for d in dirs:
        rec = d / builder.BUILDS_RECORD
        if rec.exists():
            lines += [json.loads(x) for x in rec.read_text().splitlines()]
    return lines


@pytest.fixture(scope="module")
def built_all(tmp_path_factory):
    """``--build-all`` into a fresh cache, once for this file: (cache, the CompletedProcess).
    Other tests copy an op's built directory from it instead of compiling it again."""
    cache = tmp_path_factory.mktemp("built_all") / "cache"
    first = subprocess.run([sys.executable, "-m", "dslaunch.kernels.builder", "--build-all"],
                           env=dict(os.environ, DSLAUNCH_CACHE_DIR=str(cache)), cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    return cache, first


def test_build_all_then_second_process_loads_from_cache_without_compiling(built_all):
    cache, first = built_all
    env = {"DSLAUNCH_CACHE_DIR": str(cache)}
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(builder.OPS)  # one status line per op
    cpu_ops = [name for name, spec in builder.OPS.items() if spec.kind == "cpu"]
    for ln in lines:
        if ln.split()[0] in cpu_ops:
            assert " ok: built in " in ln, ln
        else:
            assert " skipped: " in ln and "not runnable here" in ln, ln
    so_mtimes = {p: p.stat().st_mtime_ns for p in cache.rglob("*.so")}
    assert len(so_mtimes) == len(cpu_ops)

    second = _run("""
        import json, time, torch
        t = time.perf_counter()
        from dslaunch.kernels import load_op
        mods = [load_op(n) for n in ("cpu_adam", "cpu_adagrad", "cpu_lion")]
        print(json.dumps({"seconds": time.perf_counter() - t, "ok": all(mods),
                          "simd": mods[0].simd_level()}))
    """, env)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["simd"] == builder.cpu_features.chosen_level()
    print("cached load of 3 ops in a new process:", round(out["seconds"], 4), "s")
    for op in ("cpu_adam", "cpu_adagrad", "cpu_lion"):
        assert len(_builds(cache, op)) == 1, op  # compiled once, by the first process only
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*.so")} == so_mtimes
    again = subprocess.run([sys.executable, "-m", "dslaunch.kernels.builder", "--build-all"],
                           env=dict(os.environ, **env), cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert all(" ok: cached " in ln for ln in again.stdout.splitlines()
               if ln.split()[0] in cpu_ops)


def test_concurrent_first_use_builds_once(tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    code = f"""
        import os, time, torch
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        from dslaunch.kernels import load_op
        print("loaded", load_op("cpu_lion") is not None)
    """
    env = dict(os.environ, DSLAUNCH_CACHE_DIR=str(cache))
    env.pop("DSLAUNCH_SIMD", None)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(2.0)  # both have imported torch and are polling
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "loaded True" in out, err
    assert len(_builds(cache, "cpu_lion")) == 1


def test_stale_lock_of_dead_process_is_taken_over(built_all, tmp_path, monkeypatch):
    """The dead holder's build directory is a copy of cpu_lion's by ``--build-all`` without its
    manifest (a build killed before it finished): after the take-over this process finishes the
    build (ninja finds the object and the library up to date, so this test spends no ~15 s
    compile; test_concurrent_first_use_builds_once compiles cpu_lion from nothing)."""
    monkeypatch.setenv("DSLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DSLAUNCH_SIMD", raising=False)
    plan = builder.make_plan("cpu_lion")
    shutil.copytree(built_all[0] / plan.directory.name, plan.directory)
    (plan.directory / builder.MANIFEST).unlink()
    assert builder.read_manifest(plan) is None  # not built, as far as the cache knows
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = plan.directory / "dslaunch.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "token": "old"}))
    started = time.monotonic()
    manifest = builder.build(plan)
    assert manifest["pid"] == os.getpid()
    assert time.monotonic() - started < 120  # took over; did not wait for the 1800 s timeout
    assert not lock.exists()


def test_build_lock_staleness_rules(tmp_path):
    path = str(tmp_path / "x.lock")
    # another host, heartbeat old -> stale, taken over
    Path(path).write_text(json.dumps({"pid": 1, "host": "elsewhere", "token": "t1"}))
    old = time.time() - 120
    os.utime(path, (old, old))
    with BuildLock(path, stale_after=60) as lk:
        assert lk.took_over["token"] == "t1"
        assert json.loads(Path(path).read_text())["pid"] == os.getpid()
    assert not Path(path).exists()
    # another host, fresh heartbeat -> live holder: waited on, then a clear timeout
    Path(path).write_text(json.dumps({"pid": 1, "host": "elsewhere", "token": "t2"}))
    with pytest.raises(LockTimeout, match="elsewhere"):
        BuildLock(path, stale_after=60, timeout=0.5).acquire()
    # same host, live PID (ours) -> not stale
    Path(path).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    with pytest.raises(LockTimeout):
        BuildLock(path, timeout=0.3).acquire()
    # garbage content, old -> stale
    Path(path).write_text("")
    os.utime(path, (old, old))
    with BuildLock(path, stale_after=60) as lk:
        assert lk.took_over == {}


def test_missing_compiler_warns_once_and_falls_back(tmp_path):
    out = _run("""
        import warnings, torch
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from dslaunch.kernels import load_op
            from dslaunch.engine.optim.cpu_adam import DSCPUAdam
            assert load_op("cpu_adam") is None
            assert load_op("cpu_adam") is None
            p = torch.nn.Parameter(torch.ones(10))
            opt = DSCPUAdam([p], lr=0.1)
            p.grad = torch.ones(10)
            opt.step()
        assert not opt.compiled and p.detach().lt(1).all()
        msgs = [str(w.message) for w in caught if "dslaunch op 'cpu_adam'" in str(w.message)]
        print("N", len(msgs))
        print(msgs[0])
    """, {"DSLAUNCH_CACHE_DIR": str(tmp_path / "cache"), "CXX": "/nonexistent/g++"})
    assert out.returncode == 0, out.stderr
    assert "N 1" in out.stdout
    assert "C++ compiler not found: '/nonexistent/g++' ($CXX)" in out.stdout
    assert "falling back to torch" in out.stdout


def test_compile_error_shows_compiler_output_and_falls_back(tmp_path):
    src = tmp_path / "csrc"
    shutil.copytree(REPO / "cpp", src, ignore=shutil.ignore_patterns("aio"))
    lion = src / "cpu" / "cpu_lion.cpp"
    lion.write_text('#include "dslaunch/no_such_header.h"\n' + lion.read_text())
    out = _run("""
        import warnings, torch
        from dslaunch.kernels import load_op
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert load_op("cpu_lion") is None
        print(str(caught[0].message))
    """, {"DSLAUNCH_CACHE_DIR": str(tmp_path / "cache"), "DSLAUNCH_CSRC": str(src)})
    assert out.returncode == 0, out.stderr
    assert "could not be built" in out.stdout
    assert "no_such_header.h: No such file or directory" in out.stdout  # the compiler's own words
    logs = list((tmp_path / "cache").glob("cpu_lion-*/build.log"))
    assert logs and "no_such_header.h" in logs[0].read_text()


def test_forced_simd_level_is_validated(monkeypatch):
    monkeypatch.setenv("DSLAUNCH_SIMD", "avx9000")
    with pytest.raises(builder.OpUnavailable, match="DSLAUNCH_SIMD='avx9000'"):
        builder.make_plan("cpu_adam")
    monkeypatch.setenv("DSLAUNCH_SIMD", "scalar")
    scalar = builder.make_plan("cpu_adam")
    monkeypatch.delenv("DSLAUNCH_SIMD")
    best = builder.make_plan("cpu_adam")
    assert scalar.level == "scalar" and "-mavx2" not in scalar.cflags
    assert scalar.directory != best.directory  # its own cache entry


def test_sources_found_from_package_csrc_and_env(tmp_path, monkeypatch):
    """A wheel ships the sources as dslaunch/kernels/csrc; DSLAUNCH_CSRC overrides."""
    assert (Path(builder.__file__).parent / "csrc" / "include" / "dslaunch" / "simd.h").is_file()
    assert builder.source_root() is not None
    monkeypatch.setenv("DSLAUNCH_CSRC", str(tmp_path))  # no sources there: falls through
    assert builder.source_root() == (REPO / "cpp").resolve()
    shutil.copytree(REPO / "cpp" / "include", tmp_path / "include")
    assert builder.source_root() == tmp_path.resolve()


def test_corrupt_cached_library_is_rebuilt_once(built_all, tmp_path):
    """A cached .so that will not import (truncated by a full disk, say) is rebuilt, not a crash;
    when even the rebuild cannot be imported, one warning and the fallback. The cache starts as
    a copy of cpu_lion's build by ``--build-all`` (its library and its one build record)."""
    cache = tmp_path / "cache"
    env = {"DSLAUNCH_CACHE_DIR": str(cache)}
    for d in built_all[0].glob("cpu_lion-*"):
        shutil.copytree(d, cache / d.name)
    assert len(_builds(cache, "cpu_lion")) == 1
    so = next(cache.rglob("cpu_lion*.so"))
    so.write_bytes(b"not an ELF file")
    code = """
        import warnings, torch
        from dslaunch.kernels import load_op
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print("none", load_op("cpu_lion") is None)
        print("warnings", len(caught), *[str(w.message).splitlines()[0] for w in caught])
    """
    out = _run(code, env)
    assert out.returncode == 0, out.stderr
    assert "none False" in out.stdout and "warnings 0" in out.stdout
    assert len(_builds(cache, "cpu_lion")) == 2 and so.read_bytes()[:4] == b"\x7fELF"
