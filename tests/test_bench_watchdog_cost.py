"""benchmarks/bench_watchdog_cost.py runs: a tiny --smoke job writes its JSON with the expected
keys and no false alarm, for the engine and for a plain torch loop (numbers are the benchmark's
business, not checked here). ``--quick``: the plain loop's third job (recording off in both kinds
of block, whose figures this test does not look at) is not run, and the one-process
micro-measurements make a tenth of their calls."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_watchdog_cost_smoke():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_watchdog_cost.py"),
                        "--smoke", "--repeats", "1", "--steps", "8", "--no-save",
                        "--quick"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["record"]["collective_us"] > 0 and result["record"]["step_us"] > 0
    assert result["collectives_per_step"] > 0  # the engine's collectives were numbered
    train = result["train"]
    assert train["false_alarms"] == 0
    assert train["steps_per_s_on"] > 0 and train["steps_per_s_off"] > 0
    # the plain torch loop: its collectives were recorded by the bootstrap alone, no false alarm
    plain = result["plain"]
    assert plain["collectives_per_step"] > 0
    assert plain["call"]["all_reduce_us_on"] > 0 and plain["call"]["all_reduce_us_off"] > 0
    assert plain["train"]["false_alarms"] == 0 and plain["train"]["steps_per_s_on"] > 0
