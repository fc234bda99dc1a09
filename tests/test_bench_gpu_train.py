"""benchmarks/bench_gpu_train.py (issue 31 part 5) on CPU: the runner trains the tiny GPT-2 through
dslaunch's --as-deepspeed mode for each config, prints one line per run as it ends, and leaves a
JSON with every run's measurements and the per-config summary; a spent --budget records skipped runs
instead of starting them. The GPU run is the same command with --device cuda (its docstring)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "bench_gpu_train.py"
TINY = ["--device", "cpu", "--size", "tiny", "--micro-batch", "2", "--seq", "32", "--rounds", "1",
        "--steps", "2", "--warmup", "1", "--runtimes", "dslaunch", "--omp-threads", "1"]

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu_train as bgt  # noqa: E402


def _run(tmp_path, *extra, timeout=150):
    p = subprocess.run([sys.executable, str(RUNNER), *TINY, "--results-dir", str(tmp_path), *extra], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    files = sorted(tmp_path.glob("gpu_train-*.json"))
    assert len(files) == 1, p.stdout[-2000:] + p.stderr[-3000:]
    return p, json.loads(files[0].read_text())


def test_runs_on_cpu_and_writes_json(tmp_path):
    # two configs, each its own `dslaunch run`: ZeRO 0, and ZeRO 2 with the optimizer offloaded
    # (its own config section); plain z2 would prove nothing more about the runner
    configs = ["z0", "z2off"]
    p, doc = _run(tmp_path, "--configs", ",".join(configs))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert [(r["config"], r["runtime"]) for r in doc["runs"]] == [(c, "dslaunch") for c in configs]
    for r in doc["runs"]:
        assert r["status"] == "ok", r
        assert r["engine_module"].startswith("dslaunch")
        assert len(r["losses"]) == 3 and len(r["step_seconds"]) == 3
        assert r["tokens_per_step"] == 2 * 32 and r["tokens_per_s"] > 0 and r["tflops"] is not None
        assert r["params"] > 0 and Path(r["log"]).exists()
        assert f"[bench] ds {r['config']:<7} dslaunch" in p.stdout  # one line per run
        cfg = json.loads((Path(doc["args"]["work"]) / f"ds_{r['config']}_dslaunch_r0" / "ds_config.json").read_text())
        assert cfg["gradient_clipping"] == 1.0 and cfg["bf16"]["enabled"]
    off = json.loads((Path(doc["args"]["work"]) / "ds_z2off_dslaunch_r0" / "ds_config.json").read_text())
    assert off["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    # the same seed and data: every ZeRO stage gives the same first loss
    assert len({round(r["losses"][0], 4) for r in doc["runs"]}) == 1
    for c in configs:
        row = doc["summary"][c]
        assert row["dslaunch"]["runs_ok"] == 1 and row["dslaunch"]["tokens_per_s_median"] > 0
        assert row["ratio_dslaunch_over_deepspeed"]["tokens_per_s"] is None  # no peer in this run
    assert doc["versions"]["dslaunch"]["torch"] and "device_name" in doc and doc["skipped"] == []


def test_spent_budget_skips_runs(tmp_path):
    p, doc = _run(tmp_path, "--configs", "z0,z3off", "--budget", "0", timeout=60)
    assert doc["runs"] == []
    assert [(s["config"], s["reason"]) for s in doc["skipped"]] == [("z0", "budget spent"), ("z3off", "budget spent")]


def test_flops_and_configs():
    # 355M GPT-2, 8 x 1024 tokens: 6*N*T + 12*L*d*s*T
    n, t = 354_823_168, 8 * 1024
    assert bgt.flops_per_step("355m", n, t, 1024) == 6.0 * n * t + 12.0 * 24 * 1024 * 1024 * t

    class A:
        micro_batch, precision, nvme_path = 8, "bf16", "/tmp/x"

    z3off = bgt.ds_config("z3off", A)["zero_optimization"]
    assert z3off["stage"] == 3 and z3off["offload_param"]["device"] == "cpu"
    nv = bgt.ds_config("z3nvme", A)["zero_optimization"]
    assert nv["offload_optimizer"]["device"] == "nvme" and nv["offload_param"]["nvme_path"] == "/tmp/x"
    runs = [{"config": "z2", "runtime": rt, "round": 0, "status": "ok", "tokens_per_s": tps, "tflops": 1.0,
             "median_step_s": 1.0, "peak_gpu_gib": mem, "losses": losses}
            for rt, tps, mem, losses in (("dslaunch", 110.0, 9.0, [2.0, 1.0]), ("deepspeed", 100.0, 10.0, [2.0, 1.1]))]
    s = bgt.summarize(runs, ["z2"])["z2"]
    assert s["ratio_dslaunch_over_deepspeed"] == {"tokens_per_s": 1.1, "peak_gpu_mem": 0.9}
    assert abs(s["loss_max_rel_diff"] - 0.1 / 1.1) < 1e-5
