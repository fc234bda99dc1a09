"""benchmarks/cuda_paths.py (issue 31 part 6) on CPU: a fast subset of the engine paths runs and
every one is ok (or skipped with a reason) in the JSON; a path over its limit is stopped by
SIGALRM, a path stuck where the signal cannot reach is recorded by the watchdog, which
re-executes the process and the next path still runs. The CUDA run is the same script with
``--device cuda`` (benchmarks/cuda_paths.py's docstring)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cuda_paths.py"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--micro", "2"]


def _run(tmp_path, paths, *extra, timeout=150):
    out = tmp_path / "paths.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--paths", ",".join(paths),
                        "--out", str(out), *SMALL, *extra], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout


def test_fast_subset_ok_on_cpu(tmp_path):
    paths = ["cuda_kernels", "baseline", "activation_checkpointing", "tiled", "onebit_adam",
             "async_checkpoint", "offload_states_zero3", "nvme_offload"]
    data, stdout = _run(tmp_path, paths, "--nvme-dir", str(tmp_path / "nvme"))
    assert set(data["paths"]) == set(paths)
    for name in paths:
        rec = data["paths"][name]
        assert rec["status"] in ("ok", "skipped"), (name, rec)
        if rec["status"] == "skipped":
            assert rec["reason"], name
        assert f"[cuda_paths] {name} " in stdout  # one line per path as it goes
    p = data["paths"]
    assert p["baseline"]["losses"][-1] < p["baseline"]["losses"][0]
    assert p["activation_checkpointing"]["on_device"]["bit_equal_to_baseline"]  # CPU: exact
    assert p["activation_checkpointing"]["cpu_checkpointing"]["bit_equal_to_baseline"]
    assert p["tiled"]["fp32_grad_max_rel_diff"] < 1e-4
    assert p["cuda_kernels"]["quantize_cases_bit_equal"] == 12
    assert p["nvme_offload"]["swap_files"] > 0
    assert data["summary"]["ok"] == sorted(n for n in paths if p[n]["status"] == "ok")


def test_timeouts_are_recorded_and_the_run_goes_on(tmp_path):
    data, stdout = _run(tmp_path, ["_selftest_timeout", "_selftest_hang", "baseline"],
                        "--grace", "2")
    p = data["paths"]
    assert p["_selftest_timeout"]["status"] == "timeout"
    assert "PathTimeout" in p["_selftest_timeout"]["traceback_tail"]
    assert p["_selftest_hang"]["status"] == "timeout"
    assert "p__selftest_hang" in p["_selftest_hang"]["stack_tail"]  # where it hung
    assert data["meta"]["restarts"] == 1  # the watchdog re-executed the process
    assert p["baseline"]["status"] == "ok", p["baseline"]
