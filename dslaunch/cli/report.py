"""``dslaunch report``: what the compiled ops need and what state they are in (like ds_report).

Reports only: builds nothing, loads nothing, and a missing piece (no torch, no compiler, no nvcc,
no sources) is reported, never raised. ``--json`` prints one JSON object:

    {"dslaunch": {...}, "torch": {...}, "cuda": {...}, "toolchain": {...}, "cpu": {...},
     "cache_dir": str, "source_root": str | null, "ops": [{name, kind, compatible, built,
     loaded, status, reason, simd, cache_dir, description}, ...]}
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import click

from dslaunch.launcher.text_table import text_table


def _version_line(argv: list[str], pick_last: bool = False) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        return None
    return lines[-1] if pick_last else lines[0]


def _tool(path: str | None, argv_tail: list[str], pick_last: bool = False) -> dict:
    if path is None:
        return {"path": None, "version": None}
    return {"path": path, "version": _version_line([path, *argv_tail], pick_last)}


def collect() -> dict:
    from dslaunch import __version__
    from dslaunch.kernels import builder, cpu_features

    info: dict = {"dslaunch": {"version": __version__, "python": sys.version.split()[0],
                               "platform": platform.platform()}}
    try:
        import torch

        info["torch"] = {"version": torch.__version__, "path": os.path.dirname(torch.__file__),
                         "num_threads": torch.get_num_threads()}
        cuda_ok = torch.cuda.is_available()
        info["cuda"] = {"torch_cuda_version": torch.version.cuda, "available": cuda_ok,
                        "device_count": torch.cuda.device_count() if cuda_ok else 0,
                        "devices": [torch.cuda.get_device_name(i)
                                    for i in range(torch.cuda.device_count())] if cuda_ok else []}
    except Exception as exc:
        info["torch"] = {"version": None, "error": f"{type(exc).__name__}: {exc}"}
        info["cuda"] = {"available": False, "torch_cuda_version": None, "device_count": 0}
        torch = None

    cxx = builder.cxx_compiler()
    info["toolchain"] = {
        "cxx": {"name": cxx, **_tool(shutil.which(cxx), ["--version"])},
        "nvcc": _tool(builder.nvcc_path(), ["--version"], pick_last=False),
        "ninja": _tool(builder.ninja_path(), ["--version"]),
    }
    nvcc = info["toolchain"]["nvcc"]
    if nvcc["path"]:
        nvcc["version"] = _version_line([nvcc["path"], "--version"], pick_last=True)

    cpu = cpu_features.cpu_info()
    info["cpu"] = {"model": cpu.model, "arch": cpu.arch, "cores": os.cpu_count(),
                   "features": cpu.interesting_flags, "best_simd": cpu.best_level,
                   "forced_simd": os.environ.get("DSLAUNCH_SIMD") or None}
    # bf16 computing on this CPU (no CUDA device to run it): slow without native bf16 instructions
    info["cpu"]["native_bf16"] = cpu_features.native_bf16(cpu.flags, cpu.arch)
    info["cpu"]["bf16_warning"] = bf16_note(cpu.flags, cpu.arch, cpu.model,
                                            bool(info["cuda"].get("available")))
    try:
        info["cpu"]["simd"] = cpu_features.chosen_level()
    except cpu_features.SimdError as exc:
        info["cpu"]["simd"] = None
        info["cpu"]["simd_error"] = str(exc)
    info["cache_dir"] = str(builder.cache_root())
    root = builder.source_root()
    info["source_root"] = str(root) if root else None

    ops = []
    for name in builder.OPS:
        try:
            if torch is None:
                raise RuntimeError("torch is not importable")
            ops.append(builder.op_status(name))
        except Exception as exc:
            spec = builder.OPS[name]
            ops.append({"name": name, "kind": spec.kind, "description": spec.description,
                        "compatible": False, "built": False, "loaded": False, "simd": None,
                        "cache_dir": None, "status": "unknown",
                        "reason": f"{type(exc).__name__}: {exc}"})
    info["ops"] = ops
    return info


def bf16_note(flags, arch: str, model: str, cuda_available: bool) -> str | None:
    """The bf16-on-this-CPU warning, only where the CPU is the device (no CUDA) and lacks native
    bf16 instructions (dslaunch/kernels/cpu_features.py: slow_bf16_message)."""
    if cuda_available:
        return None
    from dslaunch.kernels.cpu_features import slow_bf16_message

    return slow_bf16_message(flags, arch, model)


def _yes(flag) -> str:
    return "yes" if flag else "no"


def render(info: dict) -> str:
    t, c, tc, cpu = info["torch"], info["cuda"], info["toolchain"], info["cpu"]
    lines = ["dslaunch report", "-" * 78]
    rows = [
        ("dslaunch", f"{info['dslaunch']['version']} (python {info['dslaunch']['python']})"),
        ("torch", f"{t.get('version')} at {t.get('path')}" if t.get("version") else
         f"not importable: {t.get('error')}"),
        ("CUDA", f"available: {_yes(c.get('available'))}, torch built for "
                 f"{c.get('torch_cuda_version') or 'CPU only'}, devices: {c.get('device_count', 0)}"),
        ("nvcc", f"{tc['nvcc']['path']} ({tc['nvcc']['version']})" if tc["nvcc"]["path"]
         else "not found"),
        ("C++ compiler", f"{tc['cxx']['path']} ({tc['cxx']['version']})" if tc["cxx"]["path"]
         else f"{tc['cxx']['name']!r} not found"),
        ("ninja", f"{tc['ninja']['path']} ({tc['ninja']['version']})" if tc["ninja"]["path"]
         else "not found"),
        ("CPU", f"{cpu['model']} ({cpu['arch']}, {cpu['cores']} cores)"),
        ("CPU features", " ".join(cpu["features"]) or "-"),
        ("SIMD level", (cpu["simd"] or f"none: {cpu.get('simd_error')}") +
         (f" (forced by DSLAUNCH_SIMD; best here: {cpu['best_simd']})" if cpu["forced_simd"]
          else "")),
        ("op cache", info["cache_dir"]),
        ("op sources", info["source_root"] or "not found"),
    ]
    if cpu.get("bf16_warning"):
        rows.append(("bf16 on CPU", "SLOW: " + cpu["bf16_warning"]))
    width = max(len(k) for k, _ in rows)
    lines += [f"{k:<{width}} : {v}" for k, v in rows]
    table = [("op", "kind", "compatible", "built", "loaded", "status")]
    for op in info["ops"]:
        status = op["status"] + (f" ({op['reason']})" if op.get("reason") else "")
        table.append((op["name"], op["kind"], _yes(op["compatible"]), _yes(op["built"]),
                      _yes(op["loaded"]), status))
    lines += ["-" * 78, *text_table(table, gap=" ")]
    return "\n".join(lines)


@click.command("report")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def report(as_json: bool) -> None:
    """Environment and compiled-op status (torch, CUDA, compilers, CPU SIMD, per-op state)."""
    info = collect()
    click.echo(json.dumps(info, indent=1) if as_json else render(info))
