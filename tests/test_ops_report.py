"""`dslaunch report`: JSON shape, per-op states, builds nothing, survives missing tools."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from dslaunch.kernels.ops import OPS

REPO = Path(__file__).resolve().parents[1]
OP_KEYS = {"name", "kind", "compatible", "built", "loaded", "status", "reason", "simd",
           "cache_dir", "description"}


def _report(tmp_path, *args, **env):
    full = dict(os.environ, DSLAUNCH_CACHE_DIR=str(tmp_path / "cache"), **env)
    full.pop("DSLAUNCH_SIMD", None)
    out = subprocess.run([sys.executable, "-c", "from dslaunch.cli import main; main()", "report",
                          *args], env=full,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_report_json_shape_and_builds_nothing(tmp_path):
    info = json.loads(_report(tmp_path, "--json"))
    assert set(info) >= {"dslaunch", "torch", "cuda", "toolchain", "cpu", "cache_dir",
                         "source_root", "ops"}
    assert info["torch"]["version"] == torch.__version__
    assert info["cuda"]["available"] == torch.cuda.is_available()
    assert set(info["toolchain"]) == {"cxx", "nvcc", "ninja"}
    assert info["cpu"]["simd"] in ("avx512", "avx2", "neon", "scalar")
    assert info["cache_dir"] == str(tmp_path / "cache")
    assert [op["name"] for op in info["ops"]] == list(OPS)
    for op in info["ops"]:
        assert set(op) >= OP_KEYS, op
        assert op["built"] is False and op["loaded"] is False  # fresh cache: nothing built
        if op["kind"] == "cpu":
            assert op["compatible"] and op["status"] == "compatible, not built yet", op
        elif not torch.cuda.is_available() and info["toolchain"]["nvcc"]["path"]:
            assert op["status"] == "compiles, not runnable here", op
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


def test_report_shows_built_ops_and_missing_compiler(tmp_path):
    env = dict(os.environ, DSLAUNCH_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DSLAUNCH_SIMD", None)
    # the compiler by its plain name for both runs (it is in the cache key); an image may set
    # CXX to an absolute path, which an empty PATH would not hide
    env["CXX"] = "c++"
    subprocess.run([sys.executable, "-m", "dslaunch.kernels.builder", "cpu_lion"], env=env,
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    no_tools = {"PATH": str(empty), "CUDA_HOME": str(empty), "CXX": "c++"}  # no compiler, ninja, nvcc
    info = json.loads(_report(tmp_path, "--json", **no_tools))
    ops = {op["name"]: op for op in info["ops"]}
    assert ops["cpu_lion"]["built"] and ops["cpu_lion"]["compatible"]  # cached: no compiler needed
    assert ops["cpu_lion"]["status"] == "built (cached)"
    assert not ops["cpu_adam"]["compatible"] and "C++ compiler not found" in ops["cpu_adam"]["reason"]
    assert info["toolchain"]["cxx"]["path"] is None
    text = _report(tmp_path, **no_tools)  # the human form, same facts
    assert "cpu_lion" in text and "built (cached)" in text and "cannot build here" in text
