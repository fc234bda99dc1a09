"""Build, cache and load dslaunch's compiled ops.

* Build: ``torch.utils.cpp_extension.load`` with ninja, SIMD flags for the running CPU
  (:mod:`dslaunch.kernels.cpu_features`), sources from :func:`source_root`.
* Cache: one directory per (op, torch version, compiler, flags, CPU features, source hash) under
  ``$DSLAUNCH_CACHE_DIR`` or ``~/.cache/dslaunch/ops``, holding the .so and a manifest
  (``dslaunch_build.json``). A later process that finds a matching manifest imports the .so
  directly (no ninja, no compiler check): milliseconds.
* Concurrency: the build runs under :class:`BuildLock` (PID/host lock file with stale take-over),
  so many ranks starting together build once and the others load the result.
* Failure: :class:`BuildError` carries the reason and the tail of the compiler output;
  :func:`load_op` turns it into ONE warning per op per process and returns None, so callers fall
  back to torch.

``python -m dslaunch.kernels.builder --build-all`` prebuilds every op that can run here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from dslaunch.kernels import cpu_features
from dslaunch.kernels.build_lock import BuildLock
from dslaunch.kernels.ops import OPS, OpSpec

MANIFEST = "dslaunch_build.json"
BUILD_LOG = "build.log"        # compiler output of the last attempt
BUILDS_RECORD = "builds.jsonl"  # one line per successful compile in this directory
_PKG_DIR = Path(__file__).resolve().parent
_MARKER = Path("include") / "dslaunch" / "simd.h"
CUDA_ARCHS = ("80", "90")


class OpUnavailable(RuntimeError):
    """The op cannot be used here for a reason that is not a build error (no GPU, no sources)."""


class BuildError(RuntimeError):
    """Compiling the op failed; the message names the cause and shows the compiler output."""


# -------------------------------------------------------------------------------------------------
# where things are


def source_root() -> Path | None:
    """Directory holding cpu/, cuda/, include/: $DSLAUNCH_CSRC, the wheel's dslaunch/kernels/csrc,
    or the repository's cpp/ next to an editable install."""
    candidates = []
    if os.environ.get("DSLAUNCH_CSRC"):
        candidates.append(Path(os.environ["DSLAUNCH_CSRC"]))
    candidates += [_PKG_DIR / "csrc", _PKG_DIR.parent.parent / "cpp"]
    for cand in candidates:
        if (cand / _MARKER).is_file():
            return cand.resolve()
    return None


def cache_root() -> Path:
    env = os.environ.get("DSLAUNCH_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dslaunch" / "ops"


def cxx_compiler() -> str:
    """The C++ compiler cpp_extension will call ($CXX, else c++)."""
    return os.environ.get("CXX", "c++")


def nvcc_path() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(cuda_home) / "bin" / "nvcc"
    return str(cand) if cand.is_file() else shutil.which("nvcc")


def ninja_path() -> str | None:
    found = shutil.which("ninja")
    if found:
        return found
    with contextlib.suppress(ImportError, AttributeError):
        import ninja  # the PyPI package ships the binary

        cand = Path(ninja.BIN_DIR) / "ninja"
        if cand.is_file():
            return str(cand)
    cand = Path(sysconfig.get_path("scripts")) / "ninja"
    return str(cand) if cand.is_file() else None


def cuda_runnable() -> tuple[bool, str]:
    import torch

    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


# -------------------------------------------------------------------------------------------------
# build plan: what would be compiled, and its cache key


@dataclass
class BuildPlan:
    spec: OpSpec
    level: str
    sources: list[str]
    include_dirs: list[str]
    cflags: list[str]
    cuda_cflags: list[str]
    ldflags: list[str]
    key: str
    directory: Path
    meta: dict = field(default_factory=dict)

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST


def _hash_files(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(Path(p).name).encode())
        h.update(Path(p).read_bytes())
    return h.hexdigest()


def make_plan(name: str) -> BuildPlan:
    """Plan the build of op `name` here. Raises KeyError (unknown op) or OpUnavailable."""
    import torch

    spec = OPS[name]
    root = source_root()
    if root is None:
        raise OpUnavailable("C++ sources not found (set DSLAUNCH_CSRC to the cpp/ directory)")
    sources = [str(root / s) for s in spec.sources]
    missing = [s for s in sources if not Path(s).is_file()]
    if missing:
        raise OpUnavailable(f"source missing: {missing[0]}")
    try:
        level = cpu_features.chosen_level()
    except cpu_features.SimdError as exc:
        raise OpUnavailable(str(exc)) from None
    include = root / "include"
    cflags = ["-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp", *cpu_features.simd_cflags(level)]
    cuda_cflags: list[str] = []
    ldflags = ["-fopenmp"]
    if spec.kind == "cuda":
        cflags = ["-O3", "-std=c++17"]
        archs = os.environ.get("DSLAUNCH_CUDA_ARCHS", ",".join(CUDA_ARCHS)).split(",")
        cuda_cflags = ["-O3", "-std=c++17", *[f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]]
        ldflags = []
    deps = sources + [str(p) for p in include.rglob("*.h")]
    deps += [str(p) for p in (root / "cuda").glob("*.cuh")] if spec.kind == "cuda" else []
    key_data = {
        "op": name, "torch": torch.__version__, "python": sys.version.split()[0],
        # the compiler as configured ($CXX or c++), not its resolved path: a prebuilt cache must
        # still be found on a machine (or PATH) that has no compiler at all
        "cxx": cxx_compiler(),
        "cflags": cflags, "cuda_cflags": cuda_cflags, "ldflags": ldflags,
        "cpu": cpu_features.features_hash(level), "sources": _hash_files(deps),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    directory = cache_root() / f"{name}-{level if spec.kind == 'cpu' else 'cuda'}-{key}"
    return BuildPlan(spec, level, sources, [str(include)], cflags, cuda_cflags, ldflags, key,
                     directory, key_data)


def read_manifest(plan: BuildPlan) -> dict | None:
    """The manifest of a finished build of exactly this plan, or None."""
    try:
        data = json.loads(plan.manifest_path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != plan.key or not (plan.directory / data.get("so", "")).is_file():
        return None
    return data


# -------------------------------------------------------------------------------------------------
# compile


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _check_toolchain(plan: BuildPlan) -> None:
    cxx = cxx_compiler()
    if shutil.which(cxx) is None:
        where = "$CXX" if "CXX" in os.environ else "default"
        raise BuildError(f"C++ compiler not found: {cxx!r} ({where}); install g++ or set CXX")
    if plan.spec.kind == "cuda" and nvcc_path() is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    if ninja_path() is None:
        raise BuildError("ninja not found (pip install ninja)")


def _compile(plan: BuildPlan) -> dict:
    """Run cpp_extension.load into plan.directory; write the manifest. Caller holds the lock."""
    _check_toolchain(plan)
    from torch.utils import cpp_extension

    plan.directory.mkdir(parents=True, exist_ok=True)
    # torch's own baton inside the build dir would make a later build wait forever if a killed
    # build left it behind; we hold our own lock, so any baton here is stale.
    with contextlib.suppress(FileNotFoundError):
        (plan.directory / "lock").unlink()
    env_path = os.environ.get("PATH", "")
    ninja_dir = str(Path(ninja_path()).parent)
    started = time.time()
    try:
        if ninja_dir not in env_path.split(os.pathsep):
            os.environ["PATH"] = ninja_dir + os.pathsep + env_path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cpp_extension's ABI/version chatter
            module = cpp_extension.load(
                name=plan.spec.name, sources=plan.sources, extra_cflags=plan.cflags,
                extra_cuda_cflags=plan.cuda_cflags or None, extra_ldflags=plan.ldflags,
                extra_include_paths=plan.include_dirs, build_directory=str(plan.directory),
                with_cuda=plan.spec.kind == "cuda", verbose=False, is_python_module=True)
    except Exception as exc:
        text = str(exc)
        (plan.directory / BUILD_LOG).write_text(text)
        raise BuildError(_tail(text)) from None
    finally:
        os.environ["PATH"] = env_path
    so = Path(module.__file__)
    manifest = {"key": plan.key, "op": plan.spec.name, "module": module.__name__.split(".")[-1],
                "so": so.name, "simd": plan.level, "seconds": round(time.time() - started, 3),
                "built_at": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
                "inputs": plan.meta}
    tmp = plan.directory / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, plan.manifest_path)
    with open(plan.directory / BUILDS_RECORD, "a") as rec:
        rec.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "seconds": manifest["seconds"]}) + "\n")
    _MODULES[plan.key] = module
    return manifest


def build(plan: BuildPlan, quiet: bool = True) -> dict:
    """Make sure plan's .so exists (build under the lock if needed). Returns its manifest."""
    found = read_manifest(plan)
    if found:
        return found
    plan.directory.mkdir(parents=True, exist_ok=True)

    def waiting(holder):
        if not quiet:
            print(f"{plan.spec.name}: waiting for the build by {holder}", file=sys.stderr)

    with BuildLock(str(plan.directory / "dslaunch.lock"), on_wait=waiting):
        found = read_manifest(plan)  # built by the holder we waited for
        return found if found else _compile(plan)


# -------------------------------------------------------------------------------------------------
# load

_MODULES: dict[str, object] = {}       # plan key -> module (per process)
_LOADED: dict[str, object] = {}        # op name -> module as returned by load_op
_FAILED: dict[str, str] = {}           # op name -> reason (warned once)
_LOCK = threading.Lock()


def _import_so(plan: BuildPlan, manifest: dict):
    if plan.key in _MODULES:
        return _MODULES[plan.key]
    path = str(plan.directory / manifest["so"])
    # A unique dotted name per cache entry lets two variants (e.g. avx512 and scalar) live in one
    # process; the extension's init function is found from the last component.
    fullname = f"dslaunch._ops_{plan.level}_{plan.key}.{manifest['module']}"
    loader = importlib.machinery.ExtensionFileLoader(fullname, path)
    spec = importlib.util.spec_from_file_location(fullname, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _MODULES[plan.key] = module
    return module


def load(name: str, quiet: bool = True):
    """Load op `name`, building it if needed. Raises KeyError, OpUnavailable or BuildError."""
    plan = make_plan(name)
    if plan.spec.kind == "cuda":
        ok, why = cuda_runnable()
        if not ok:
            raise OpUnavailable(why)
    manifest = build(plan, quiet=quiet)
    try:
        return _import_so(plan, manifest)
    except ImportError:
        if plan.key in _MODULES or manifest.get("pid") == os.getpid():
            raise  # we just built it ourselves: rebuilding would give the same
    # a cached .so that does not import (truncated file, ...): rebuild once, under the lock
    with BuildLock(str(plan.directory / "dslaunch.lock")):
        if read_manifest(plan) == manifest:
            plan.manifest_path.unlink()
            with contextlib.suppress(FileNotFoundError):  # else ninja finds it up to date
                (plan.directory / manifest["so"]).unlink()
    return _import_so(plan, build(plan, quiet=quiet))


def load_op(name: str):
    """The op's module, or None (with one warning per op and process) when it cannot be had."""
    with _LOCK:
        if name in _LOADED:
            return _LOADED[name]
        if name in _FAILED:
            return None
        if name not in OPS:
            raise KeyError(f"unknown op {name!r}; known: {', '.join(OPS)}")
        try:
            module = load(name)
        except Exception as exc:
            # unwritable cache, lock timeout, a cached .so that will not import ...
            _FAILED[name] = f"{type(exc).__name__}: {exc}"
            what = ("is unavailable" if isinstance(exc, OpUnavailable) else
                    "could not be built" if isinstance(exc, BuildError) else
                    f"could not be loaded ({type(exc).__name__})")
            warnings.warn(f"dslaunch op {name!r} {what}; falling back to torch.\n{exc}",
                          RuntimeWarning, stacklevel=2)
            return None
        _LOADED[name] = module
        return module


def failure_reason(name: str) -> str | None:
    """Why load_op(name) returned None in this process (None if it did not fail)."""
    return _FAILED.get(name)


# -------------------------------------------------------------------------------------------------
# status (for `dslaunch report`: never builds) and --build-all


def op_status(name: str) -> dict:
    spec = OPS[name]
    out = {"name": name, "kind": spec.kind, "description": spec.description, "compatible": False,
           "built": False, "loaded": name in _LOADED, "cache_dir": None, "simd": None,
           "status": "", "reason": _FAILED.get(name)}
    try:
        plan = make_plan(name)
    except OpUnavailable as exc:
        out.update(status="unavailable", reason=str(exc))
        return out
    out.update(cache_dir=str(plan.directory), simd=plan.level if spec.kind == "cpu" else None)
    out["built"] = read_manifest(plan) is not None
    if spec.kind == "cuda":
        ok, why = cuda_runnable()
        if not ok:
            nvcc = nvcc_path()
            out.update(compatible=False,
                       status="compiles, not runnable here" if nvcc else "not runnable here",
                       reason=why + ("" if nvcc else "; nvcc not found"))
            return out
    if not out["built"]:
        try:
            _check_toolchain(plan)
        except BuildError as exc:
            out.update(status="cannot build here", reason=str(exc))
            return out
    out["compatible"] = True
    if out["loaded"]:
        out["status"] = "loaded"
    elif out["reason"]:
        out["status"] = "failed"
    else:
        out["status"] = "built (cached)" if out["built"] else "compatible, not built yet"
    return out


def build_all(names=None, stream=sys.stdout) -> int:
    """Build every op that can run here; one status line per op. Returns the number of failures."""
    failures = 0
    names = list(names or OPS)
    width = max((len(n) for n in names), default=0)  # the status column lines up whatever the names
    for name in names:
        started = time.time()
        try:
            plan = make_plan(name)
            if plan.spec.kind == "cuda":
                ok, why = cuda_runnable()
                if not ok:
                    note = "compiles (make cuda-check), " if nvcc_path() else ""
                    print(f"{name:<{width}} skipped: {note}not runnable here ({why})", file=stream)
                    continue
            cached = read_manifest(plan) is not None
            manifest = build(plan, quiet=False)
            _import_so(plan, manifest)
            what = "cached" if cached else f"built in {time.time() - started:.1f}s"
            print(f"{name:<{width}} ok: {what} [{plan.level if plan.spec.kind == 'cpu' else 'cuda'}] "
                  f"{plan.directory / manifest['so']}", file=stream)
        except OpUnavailable as exc:
            print(f"{name:<{width}} skipped: {exc}", file=stream)
        except BuildError as exc:
            failures += 1
            first = str(exc).strip().splitlines()
            print(f"{name:<{width}} FAILED: {first[0] if first else exc} (log: "
                  f"{plan.directory / BUILD_LOG})", file=stream)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dslaunch.kernels.builder",
                                 description="Build dslaunch's compiled ops into the cache.")
    ap.add_argument("--build-all", action="store_true", help="build every op that can run here")
    ap.add_argument("ops", nargs="*", help="op names to build (default with --build-all: all)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any op fails to build")
    args = ap.parse_args(argv)
    if not args.build_all and not args.ops:
        ap.error("name ops to build, or pass --build-all")
    unknown = [n for n in args.ops if n not in OPS]
    if unknown:
        ap.error(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    failures = build_all(args.ops or None)
    return 1 if failures and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
