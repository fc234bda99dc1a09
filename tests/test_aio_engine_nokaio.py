"""The engine's compile-time fallback: built without kernel AIO (as where <linux/aio_abi.h> is
missing), a handle runs on the pread/pwrite thread pool, says why, and still round-trips data with
O_DIRECT. Compiled here with the system C++ compiler and a small C++ driver (no Python binding)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

AIO_SRC = Path(__file__).resolve().parents[1] / "cpp" / "aio"

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include "aio_engine.h"
int main(int argc, char** argv) {
  dsaio::Config c; c.block_size = 65536; c.queue_depth = 4; c.threads = 3;
  dsaio::Handle h(c);
  std::printf("backend=%s\nnote=%s\n", h.backend().c_str(), h.backend_note().c_str());
  const long n = (1L << 20) + 7;
  void *a = nullptr, *b = nullptr;
  if (posix_memalign(&a, 4096, n) || posix_memalign(&b, 4096, n)) return 2;
  for (long i = 0; i < n; ++i) static_cast<unsigned char*>(a)[i] = (unsigned char)(i * 131 + 7);
  std::memset(b, 0, n);
  std::string path = std::string(argv[1]) + "/data.bin";
  std::string err = h.wait_op(h.submit(false, (char*)a, n, path, 0));
  if (!err.empty()) { std::printf("write: %s\n", err.c_str()); return 3; }
  h.submit(true, (char*)b, n, path, 0);
  std::string first;
  long done = h.wait_all(&first);
  std::printf("done=%ld equal=%d direct=%lld buffered=%lld\n", done, std::memcmp(a, b, n) == 0,
              (long long)h.stats.direct_bytes.load(), (long long)h.stats.buffered_bytes.load());
  try { dsaio::Config k; k.backend = "linux-aio"; dsaio::Handle x(k); return 4; }
  catch (const std::exception& e) { std::printf("explicit=%s\n", e.what()); }
  return first.empty() ? 0 : 5;
}
"""


def test_engine_without_kernel_aio(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "driver.cpp").write_text(DRIVER)
    exe = tmp_path / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", "-DDSLAUNCH_AIO_NO_KERNEL_AIO",
                    f"-I{AIO_SRC}", str(tmp_path / "driver.cpp"), str(AIO_SRC / "aio_engine.cpp"),
                    "-o", str(exe)], check=True, timeout=180)
    data = tmp_path / "data"
    data.mkdir()
    r = subprocess.run([str(exe), str(data)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert lines["backend"] == "threads"
    assert "kernel AIO not compiled in" in lines["note"]
    assert "kernel AIO not compiled in" in lines["explicit"]
    assert lines["done"].startswith("1 equal=1 direct=2097152 buffered=14")
