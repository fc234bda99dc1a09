"""benchmarks/bench_moe_dispatch.py runs: one block of one iteration per dispatch writes its JSON
with every variant's figures (no numbers checked beyond what a dispatch implies: the dropless ones
drop nothing, and the ragged one's experts run on fewer rows than the padded one's)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT, rank_env


def test_bench_moe_dispatch_smoke(tmp_path):
    out = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_moe_dispatch.py"),
                           "--blocks", "1", "--iters", "1", "--tokens", "64", "--d-model", "16",
                           "--out", str(out)], cwd=ROOT, env=rank_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    s = res["summary"]
    assert set(s) == {"capacity_1.25", "dropless_padded", "dropless_ragged"}
    for rank in res["ranks"]:
        assert rank["dropless_padded"]["dropped"] == rank["dropless_ragged"]["dropped"] == 0
    assert s["dropless_ragged"]["expert_rows"] < s["dropless_padded"]["expert_rows"]
    assert s["dropless_ragged"]["ratio_capacity_over_this_wall_ms_p20"] > 0
