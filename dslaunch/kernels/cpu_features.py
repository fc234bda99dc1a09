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
