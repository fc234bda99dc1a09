"""benchmarks/bench_pipe.py's plumbing on a tiny model (no peer, no timing assertions): the
schedule part runs 2 stages x 8 micro-batches under 1F1B and GPipe through `dslaunch run` and
reports what the executor measured."""

import json
import subprocess
import sys

from helpers import ROOT


def test_bench_pipe_smoke_schedule_part():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_pipe.py"), "--smoke",
                           "--no-save", "--parts", "schedule"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)["schedule"]
    one, gp = out["1f1b"], out["gpipe"]
    assert "error" not in one and "error" not in gp, (one.get("error"), gp.get("error"))
    # 1F1B holds at most P - s micro-batches on stage s; GPipe all 8 on both stages
    assert one["peak_live_micro_batches"] == [2, 1]
    assert gp["peak_live_micro_batches"] == [8, 8]
    assert all(g > o > 0 for o, g in zip(one["peak_activation_bytes"],
                                          gp["peak_activation_bytes"]))
    assert one["bubble_theory_1f1b"] == round(1 / 9, 4)
    assert all(0.0 <= b < 1.0 for b in one["bubble_measured_per_stage"])
    assert one["tokens_per_s"] > 0 and one["p2p_headers_with_shapes"] == [1, 1]
