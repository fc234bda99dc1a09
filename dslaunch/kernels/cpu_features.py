"""Which SIMD level the CPU ops are built for, read from the running CPU.

Levels, best first: ``avx512`` (avx512f+bw+vl+dq with fma/avx2), ``avx2`` (avx2+fma), ``neon``
(aarch64; the scalar source, auto-vectorised by -O3), ``scalar`` (anything else).
``DSLAUNCH_SIMD=<level>`` forces a level (``scalar`` for tests and odd CPUs); forcing a level the
CPU lacks is an error the builder reports. Each level has its own flags and therefore its own
build cache entry.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass
from functools import lru_cache

LEVELS = ("avx512", "avx2", "neon", "scalar")

# flags /proc/cpuinfo must show for a level (x86 spellings; aarch64 always has NEON)
_REQUIRED = {
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"},
    "avx2": {"avx2", "fma"},
}
_CFLAGS = {
    "avx512": ["-DDSLAUNCH_SIMD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
               "-mavx2", "-mfma"],
    "avx2": ["-DDSLAUNCH_SIMD_AVX2", "-mavx2", "-mfma"],
    "neon": ["-DDSLAUNCH_SIMD_NEON"],
    "scalar": [],
}
# features worth showing in `dslaunch report` (and hashed into the cache key)
_INTERESTING = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512dq", "avx512_bf16", "avx512_fp16", "amx_bf16", "asimd", "sve", "bf16")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    flags: frozenset

    @property
    def interesting_flags(self) -> list[str]:
        return [f for f in _INTERESTING if f in self.flags]

    def supports(self, level: str) -> bool:
        if level == "scalar":
            return True
        if level == "neon":
            return self.arch in ("aarch64", "arm64")
        return self.arch in ("x86_64", "amd64") and _REQUIRED[level] <= self.flags

    @property
    def best_level(self) -> str:
        return next(lvl for lvl in LEVELS if self.supports(lvl))


@lru_cache(maxsize=None)
def cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    model, flags = "", set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return CpuInfo(model=model or platform.processor() or "unknown", arch=platform.machine().lower(),
                   flags=frozenset(flags))


class SimdError(ValueError):
    pass


def chosen_level(env: dict | None = None) -> str:
    """The level to build for: DSLAUNCH_SIMD if set (validated), else the CPU's best."""
    env = os.environ if env is None else env
    info = cpu_info()
    forced = env.get("DSLAUNCH_SIMD", "").strip().lower()
    if forced in ("", "auto"):
        return info.best_level
    if forced not in LEVELS:
        raise SimdError(f"DSLAUNCH_SIMD={forced!r} is not one of {', '.join(LEVELS)} (or auto)")
    if not info.supports(forced):
        raise SimdError(f"DSLAUNCH_SIMD={forced} but this CPU ({info.model}) lacks it; "
                        f"best available: {info.best_level}")
    return forced


def simd_cflags(level: str) -> list[str]:
    return list(_CFLAGS[level])


def features_hash(level: str) -> str:
    """Hash of what the build depends on about the CPU: arch, level and its required flags."""
    info = cpu_info()
    text = "|".join([info.arch, level, *sorted(_REQUIRED.get(level, ()))])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# -- bf16 on the CPU ---------------------------------------------------------------------------
# The instructions that compute bf16 natively: x86's AVX512-BF16 and AMX-BF16, aarch64's BF16
# (ARMv8.6). Without them torch converts bf16 to fp32 and back around every kernel.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_ARM_BF16 = "bf16"
# Measured with benchmarks/bench_cpu_bf16.py (1 thread, median of 5, torch 2.13 CPU wheel;
# benchmarks/results/cpu-bf16-20261127-202359.json): the example GPT's MLP block (d_model 512,
# 1024 tokens) forward + backward 1.05 s fp32 vs 30.6 s bf16 (29x); a plain (1024x512)@(512x2048)
# matmul 0.19 s vs 18.3 s (95x). The whole 27M example GPT: 1.1 s vs 38-40 s a step (~35x).
BF16_COST = {"ratio": 29.0, "cpu": "AMD EPYC (family 25, Zen 3)",
             "flags": "avx2+fma, no avx512f / avx512_bf16 / amx_bf16",
             "case": "the example GPT's MLP block, forward + backward"}


def native_bf16(flags, arch: str) -> bool | None:
    """True where the CPU has bf16 instructions, False where it lacks them, None for an
    architecture this does not know (no claim)."""
    arch = arch.lower()
    if arch in ("x86_64", "amd64", "i686", "x86"):
        return bool(BF16_FLAGS & set(flags))
    if arch in ("aarch64", "arm64"):
        return _ARM_BF16 in set(flags)
    return None


def slow_bf16_message(flags, arch: str, model: str) -> str | None:
    """The warning for a bf16 job computing on this CPU, or None when it has native bf16 (or the
    architecture is unknown). Pure: given the flags, so it is testable with any flag set."""
    if native_bf16(flags, arch) is not False:
        return None
    missing = (sorted(BF16_FLAGS) if arch.lower() not in ("aarch64", "arm64") else [_ARM_BF16])
    has = [f for f in ("avx512f", "avx2", "asimd") if f in set(flags)]
    cost = ""
    if BF16_COST["ratio"]:
        cost = (f" Measured: bf16 is {BF16_COST['ratio']:.0f}x slower than fp32 ({BF16_COST['case']}"
                f", benchmarks/bench_cpu_bf16.py on {BF16_COST['cpu']}, {BF16_COST['flags']}).")
    return (f"bf16 on a CPU without native bf16 instructions: this CPU ({model}; has "
            f"{', '.join(has) or 'no AVX2/AVX-512'}) lacks {' / '.join(missing)}, so every bf16 "
            f"matmul is emulated through fp32 conversions and runs many times slower than fp32.{cost} "
            f"Train in fp32 here (drop the bf16 section), or use a CPU with avx512_bf16 / AMX "
            f"(Intel Sapphire Rapids or later, AMD Zen 4 or later).")


def slow_bf16_warning() -> str | None:
    """``slow_bf16_message`` for the running CPU."""
    info = cpu_info()
    return slow_bf16_message(info.flags, info.arch, info.model)
