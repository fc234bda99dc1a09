"""benchmarks/bench_async_checkpoint.py runs end to end on a tiny model (1 rank, 1 save per mode)
and reports its keys; no number is checked (numbers come from the benchmark itself)."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_async_checkpoint.py"


@pytest.mark.slow
def test_bench_async_checkpoint_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("_bench_async_checkpoint", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.measure(nproc=1, saves=1, baseline_steps=1, after_steps=1, ckpt_root=str(tmp_path),
                        model={"n_layer": 1, "d_model": 32, "n_head": 2, "vocab_size": 256})
    assert out["sync"]["async_save"] is False and out["async"]["async_save"] is True
    for mode in ("sync", "async"):
        (row,) = out[mode]["per_save"]
        assert set(row) == {"call_s", "wait_s", "after_steps_extra_s", "blocked_s", "stall_s"}
        assert out[mode]["checkpoint_bytes"] > 0
    assert out["ratio"] > 0 and out["ratio_blocked"] > 0
    assert not list(tmp_path.iterdir())  # the checkpoints are removed
