"""The peak FLOP/s of this rank's device, the denominator of MFU.

- GPU: a spec table of dense (no sparsity) tensor-core peaks per dtype, matched on the device
  name. fp32 uses the TF32 peak when torch lets matmuls use TF32, else the plain fp32 one.
- CPU: no table can know the cores and vector units a rank gets, so the peak is a roofline
  measured once: the best rate of a large square matmul in the training dtype on this process's
  threads, cached (per CPU model, thread count, dtype and torch version) in
  ``cpu_peak.json`` beside the compiled ops (``$DSLAUNCH_CACHE_DIR`` or ``~/.cache/dslaunch/ops``),
  so later runs do not measure again.

``device_peak`` returns ``(flops_per_second, source)``; ``source`` says which of the two it is,
for the log line.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

# name fragment -> dense peak TFLOP/s per dtype ("tf32" for fp32 matmuls on tensor cores).
# Checked in order, so the more specific names come first.
GPU_PEAK_TFLOPS = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
)

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
CPU_PEAK_FILE = "cpu_peak.json"


def gpu_peak(name: str, dtype: torch.dtype) -> tuple[float, str] | None:
    """(FLOP/s, source) from the table for a GPU called ``name``; None when it is not listed."""
    key = _DTYPE_NAMES.get(dtype, "fp32")
    if key == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        key = "tf32"
    for fragment, peaks in GPU_PEAK_TFLOPS:
        if fragment in name:
            value = peaks.get(key) or peaks.get("fp32")
            return value * 1e12, f"spec table: {fragment} {key} dense {value:g} TFLOPS"
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """The best FLOP/s of an ``n x n`` matmul in ``dtype`` on this process's CPU threads."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool, packing buffers
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def cpu_peak(dtype: torch.dtype = torch.float32, cache_dir=None) -> tuple[float, str]:
    """(FLOP/s, source) of this CPU's matmul roofline, measured on first use and then cached."""
    from dslaunch.kernels.builder import cache_root

    path = os.path.join(str(cache_dir or cache_root()), CPU_PEAK_FILE)
    key = f"{_cpu_model()}|threads={torch.get_num_threads()}|{_DTYPE_NAMES.get(dtype, str(dtype))}" \
          f"|torch={torch.__version__}"
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    if key in table:
        return float(table[key]), f"CPU matmul roofline {table[key] / 1e9:.1f} GFLOPS (cached)"
    value = measure_matmul_peak(dtype)
    table[key] = value
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, path)  # concurrent ranks: the last whole file wins, never a torn one
    except OSError:
        pass  # an unwritable cache only costs a measurement next time
    return value, f"CPU matmul roofline {value / 1e9:.1f} GFLOPS (measured)"


def device_peak(device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[float, str]:
    """(FLOP/s, source) for ``device``: a GPU's from the table (its CPU-measured roofline is no
    stand-in, so an unlisted GPU gives 0 and MFU is not shown), a CPU's from the roofline."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = gpu_peak(name, dtype)
        return found if found is not None else (0.0, f"{name} is not in the spec table")
    return cpu_peak(dtype)
