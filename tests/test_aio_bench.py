"""benchmarks/bench_aio.py runs end to end (tiny size, one round) and writes the expected JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_aio.py"


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (.ci/apt-install.sh)")
def test_bench_aio_smoke(tmp_path):
    work = tmp_path / "dir"
    work.mkdir()
    r = subprocess.run([sys.executable, str(BENCH), "--dir", str(work), "--size", "8M", "--repeats", "2",
                        "--block-size", "256K", "--queue-depth", "4", "--threads", "2",
                        "--results-dir", str(tmp_path / "results")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["io_mode"] == "O_DIRECT" and out["size_bytes"] == 8 << 20
    assert set(out["gbps_runs"]) == {"op_write", "op_read", "fio_write", "fio_read"}
    assert all(len(v) == 2 and min(v) > 0 for v in out["gbps_runs"].values())
    assert set(out["ratio_op_over_fio"]) == {"write", "read"}
    assert out["config"]["read"]["intra_op_parallelism"] == 2
    # the op moved every byte with O_DIRECT: 1 layout write + 2 writes, 2 reads
    assert out["op_stats"]["write"]["direct_bytes"] == 3 * (8 << 20)
    assert out["op_stats"]["read"]["direct_bytes"] == 2 * (8 << 20)
    saved = list((tmp_path / "results").glob("aio-*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["benchmark"] == "aio"
    assert list(work.iterdir()) == []
