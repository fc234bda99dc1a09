"""Locate or create the DeepSpeed peer venv that benchmarks compare against.

DeepSpeed is a peer, never a dependency: it lives in its own venv at ``benchmarks/.peer-venv``
(override with ``DSLAUNCH_PEER_VENV``), made so the comparison is fair: torch pinned
to the version of the running interpreter first (else pip pulls a multi-GB CUDA build), then
deepspeed, ninja and py-cpuinfo.

Idempotent: a venv whose ``import deepspeed`` works is reused as it is; a half-made one (an
interrupted pip) is completed. Concurrent callers serialise on a lock file next to the venv.

    python benchmarks/peers.py            # create if needed, print the venv's python
    python benchmarks/peers.py --check    # print it if ready, exit 1 otherwise (creates nothing)

From Python: ``from peers import peer_python; py = peer_python(create=True)`` (None if it cannot be
made, with the reason on stderr), then run the peer code with ``subprocess.run([py, ...])``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = HERE / ".peer-venv"
# transformers (the version the project tests with): bench_autotp and the HF Trainer benches
# build the same Hugging Face model on both sides
PEER_PACKAGES = ["deepspeed", "ninja", "py-cpuinfo", "transformers==5.24.0"]


def venv_dir() -> Path:
    return Path(os.environ.get("DSLAUNCH_PEER_VENV", DEFAULT_VENV))


def torch_spec() -> str:
    """The torch the peer gets: the version this interpreter runs (local tag stripped)."""
    spec = os.environ.get("DSLAUNCH_PEER_TORCH")
    if spec:
        return spec
    try:
        import torch

        return "torch==" + torch.__version__.split("+")[0]
    except ImportError:
        return "torch==2.13.0"


def _ready(py: Path) -> bool:
    if not py.exists():
        return False
    probe = subprocess.run([str(py), "-c", "import deepspeed, torch, cpuinfo"],
                           capture_output=True, text=True, timeout=300)
    return probe.returncode == 0


def _run(cmd: list[str], log) -> None:
    print("+ " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def peer_python(create: bool = True, quiet: bool = False) -> str | None:
    """Path of the peer venv's python with deepspeed importable, or None."""
    venv = venv_dir()
    py = venv / "bin" / "python"
    if _ready(py):
        return str(py)
    if not create:
        return None
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = sys.stderr if not quiet else open(os.devnull, "w")
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if we die
        if _ready(py):  # someone else finished it while we waited
            return str(py)
        try:
            if not py.exists():
                _run([sys.executable, "-m", "venv", str(venv)], log)
            pip = [str(py), "-m", "pip", "install", "-q"]
            _run(pip + [torch_spec()], log)
            _run(pip + PEER_PACKAGES, log)
        except (subprocess.CalledProcessError, OSError) as exc:
            print(f"peers: cannot create the DeepSpeed venv at {venv}: {exc}", file=sys.stderr)
            return None
    return str(py) if _ready(py) else None


def main(argv: list[str]) -> int:
    py = peer_python(create="--check" not in argv)
    if py is None:
        print(f"peer venv not ready: {venv_dir()}", file=sys.stderr)
        return 1
    print(py)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
