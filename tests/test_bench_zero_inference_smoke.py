"""benchmarks/bench_zero_inference.py --smoke: the plumbing (tiny Llama, fp32, CPU), dslaunch and,
where the peer venv is there, DeepSpeed 0.19.8 on the same script and config: every run ok,
the greedy tokens equal the unsharded model's (``--check``), JSON with both summaries."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT

PEER = ROOT / "benchmarks" / ".peer-venv" / "bin" / "python"


def test_bench_zero_inference_smoke(tmp_path):
    runtimes = "dslaunch,deepspeed" if PEER.exists() else "dslaunch"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_zero_inference.py"), "--smoke",
           "--check", "--runtimes", runtimes, "--results-dir", str(tmp_path), "--timeout", "240",
           "--omp-threads", "1"]
    if PEER.exists():
        cmd += ["--peer-python", str(PEER)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("zero_inference-*.json")
    doc = json.loads(path.read_text())
    assert [r["status"] for r in doc["runs"]] == ["ok"] * len(runtimes.split(","))
    for run in doc["runs"]:
        assert run["result"]["match"] is True
        assert run["result"]["at_rest_after"]["param_storage_bytes"] == 0
    for rt in runtimes.split(","):
        assert doc["summary"][rt]["prefill_tokens_per_s"] > 0
    if PEER.exists():
        assert set(doc["summary"]["dslaunch_over_deepspeed"]) >= {"prefill_tokens_per_s",
                                                                  "generate_tokens_per_s"}
