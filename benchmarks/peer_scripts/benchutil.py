"""Harness helpers shared by the bench_*.py harnesses (they live here, beside the peer
scripts): machine facts, versions, the peer venv, medians, result files. Standard library only: the
harness itself never imports torch (``end_spawned_worker``, called in spawned ranks, uses theirs)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/
REPO = HERE.parent
PEER_SCRIPTS = HERE / "peer_scripts"
RESULTS = HERE / "results"


def venv_bin(name: str) -> str | None:
    """An executable next to the running interpreter (the dslaunch venv), else on PATH."""
    cand = Path(sys.executable).parent / name
    if cand.exists():
        return str(cand)
    return shutil.which(name)


def peer_python(create: bool) -> str | None:
    """The DeepSpeed peer venv's python (benchmarks/peers.py), or None when absent."""
    sys.path.insert(0, str(HERE))
    try:
        import peers
    except ImportError:
        venv = HERE / ".peer-venv" / "bin" / "python"
        return str(venv) if venv.exists() else None
    finally:
        sys.path.remove(str(HERE))
    return peers.peer_python(create=create)


def pkg_version(name: str, python: str | None = None) -> str | None:
    if python is None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None
    code = f"import importlib.metadata as m\ntry: print(m.version({name!r}))\nexcept Exception: print('')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def machine() -> dict:
    info = {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info["cpu_model"] = fields.get("Model name")
        info["cpus"] = fields.get("CPU(s)")
        info["threads_per_core"] = fields.get("Thread(s) per core")
        info["avx512_bf16"] = "avx512_bf16" in fields.get("Flags", "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except OSError:
        pass
    return info


def loadavg() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def git_rev() -> dict:
    def run(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return {"commit": run("rev-parse", "HEAD"), "dirty_files": len(run("status", "--porcelain").splitlines())}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def save_json(result: dict, kind: str, results_dir: Path | None) -> Path | None:
    """Write ``<results_dir>/<kind>-<timestamp>.json`` (temporary name, then rename)."""
    if results_dir is None:
        return None
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{kind}-{timestamp()}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.rename(path)
    return path


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_spawned_worker() -> None:
    """End a spawned rank after its work: barrier, destroy the groups, flush, then ``os._exit``.
    A normal interpreter exit lets gloo's threads outlive the objects they serve, and a rank
    aborts now and then ("terminate called without an active exception", SIGABRT)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def split(text: str) -> list:
    """A comma-separated option value as a list (empty items dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def kill_group(proc) -> None:
    """SIGTERM, then SIGKILL, a run started with ``start_new_session=True`` (its whole group)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: list, log_path: Path, env: dict, timeout: float) -> tuple:
    """Run ``cmd`` in its own session from the repository, output to ``log_path``; ("timeout"
    after ``timeout`` s, the group killed) -> (returncode, wall seconds)."""
    t0 = time.perf_counter()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = "timeout"
    return rc, time.perf_counter() - t0


def paired(a_runs, b_runs, key: str) -> list:
    """Per-repeat ratios of ``key`` (the runs of one repeat were adjacent in time): shows the noise."""
    b = {r["repeat"]: r for r in b_runs if r["status"] == "ok"}
    return [ratio(r[key], b[r["repeat"]][key]) for r in a_runs
            if r["status"] == "ok" and r["repeat"] in b]


def loss_diff(a, b):
    """The largest per-step loss difference over the steps both have (None when none)."""
    n = min(len(a), len(b))
    return max(abs(x - y) for x, y in zip(a[:n], b[:n])) if n else None
