"""``dslaunch autotune``: bad input named by key, the space and its pruning, the tuners' choices,
each trial outcome from a real process, and one end-to-end search of examples/train_gpt.py on 2
ranks that is killed with SIGKILL mid-trial, resumed, and finds the best of its space.

Which trials run is known by construction, not by timing: of the space (stage 2, 1) x (no
offload, NVMe) x micro-batch (1, 2, 4), micro-batch 4 is over ``max_train_batch_size``, stage 1
without offload does not fit ``--memory-per-rank`` (the memory estimator), every NVMe trial fails
(no ``nvme_path``: the trial's ``dslaunch run`` refuses its config), which leaves stage 2 at
micro-batch 1 and 2; the best is the one of those two whose measured throughput is higher (which
one that is depends on the host, so the test reads the measurements rather than assuming).
"""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest
from click.testing import CliRunner

from dslaunch.autotune.space import Experiment, build_space, generated_micro_batches, memory_pruned
from dslaunch.autotune.trial import run_trial, script_args
from dslaunch.autotune.tuners import make_tuner
from dslaunch.cli import main
from helpers import DSLAUNCH, EXAMPLES

TINY = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--seq-len", "32",
        "--data-bytes", "65536", "--steps", "50"]
TINY_PARAMS = 30176  # the GPT above (embeddings, one block, head)


def _section(**kw):
    base = dict(min_train_micro_batch_size_per_gpu=1, max_train_micro_batch_size_per_gpu=1024,
                max_train_batch_size=None, min_train_batch_size=1, num_tuning_micro_batch_sizes=3,
                metric="throughput", tuner_early_stopping=5, tuner_num_trials=50)
    return SimpleNamespace(**{**base, **kw})


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("change, key", [
    ({"metric": "speed"}, "autotuning.metric"),
    ({"tuner_type": "bayes"}, "autotuning.tuner_type"),
    ({"start_profile_step": 4, "end_profile_step": 4}, "autotuning.end_profile_step"),
    ({"num_tuning_micro_batch_sizes": 0}, "autotuning.num_tuning_micro_batch_sizes"),
])
def test_bad_autotuning_key_is_named(tmp_path, change, key):
    cfg = {"train_micro_batch_size_per_gpu": 2, "autotuning": {"enabled": True, **change}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    out = CliRunner().invoke(main, ["autotune", "--config", str(path), "--nproc-per-node", "2",
                                    "train.py"])
    assert out.exit_code != 0
    assert key in out.output, out.output
    assert not (tmp_path / "autotuning_results").exists()  # refused before any trial


def test_bad_tuned_value_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": [1, 5]},
                                "autotuning": {"enabled": True}}))
    out = CliRunner().invoke(main, ["autotune", "--config", str(path), "train.py"])
    assert out.exit_code != 0 and "zero_optimization.stage: 5 is not allowed" in out.output


# --- the space, the pruning and the tuners (no trial) -----------------------------------------

def test_generated_micro_batches_respect_the_bounds():
    assert generated_micro_batches(_section(max_train_batch_size=64), gas=1, dp=2) == [1, 8, 32]
    assert generated_micro_batches(_section(max_train_batch_size=24, num_tuning_micro_batch_sizes=9),
                                   gas=1, dp=2) == [1, 2, 4, 8, 12]
    assert generated_micro_batches(_section(max_train_batch_size=1), gas=1, dp=2) == []


def test_space_prunes_batch_bounds_and_memory():
    tin = SimpleNamespace(section=_section(max_train_batch_size=8), micro_batches=[1, 2, 4, 8],
                          gas=1, stages=[0, 3], offload_optimizer=["none", "cpu"],
                          offload_param=["none", "cpu"])
    exps, pruned = build_space(tin, dp=2)
    names = [e.name for e in exps]
    # stage 0 takes no offload; parameter offload only with optimizer offload is not required
    assert names[:3] == ["z0_mbs1", "z0_mbs2", "z0_mbs4"]
    assert "z3_oo-cpu_op-cpu_mbs4" in names and not any("z0_oo" in n for n in names)
    assert {e.micro_batch for e, _ in pruned} == {8}
    # 1M parameters fp32 Adam: stage 0 holds 16 MB per rank, stage 3 on 2 ranks 8 MB, 2 MB with
    # the optimizer offloaded, 0 with the parameters too
    keep, out = memory_pruned(exps, 10**6, 2, 2, "fp32", "adam", device_bytes=9 * 10**6,
                              host_bytes=10**12)
    assert {e.stage for e, _ in out} == {0}
    assert all("model states" in reason for _, reason in out)
    assert {e.stage for e in keep} == {3}


def _rec(exp, index, status="ok", throughput=None):
    metrics = {"throughput": throughput, "latency": 1.0 / throughput} if throughput else None
    return {"name": exp.name, "index": index, "status": status, "micro_batch": exp.micro_batch,
            "group": list(exp.group), "metrics": metrics}


def test_tuners_order_oom_skip_and_early_stopping():
    exps = [Experiment(s, "none", "none", m) for s in (1, 2) for m in (1, 2, 4)]
    section = _section(tuner_early_stopping=2, tuner_num_trials=50)
    grid = make_tuner("gridsearch", exps, section)
    records = {}
    exp, _ = grid.next(records)
    assert exp.name == "z1_mbs1"
    records[exp.name] = _rec(exp, 0, "ok", 10.0)
    exp, _ = grid.next(records)
    records[exp.name] = _rec(exp, 1, "oom")  # z1_mbs2: out of memory -> z1_mbs4 skipped
    exp, _ = grid.next(records)
    assert exp.name == "z2_mbs1"
    assert [e.name for e, _ in grid.skipped(records)] == ["z1_mbs4"]
    records[exp.name] = _rec(exp, 2, "ok", 5.0)  # second trial in a row without improvement
    assert grid.next(records) == (None, grid.stop_reason(records))
    assert "tuner_early_stopping" in grid.stop_reason(records)

    # random: the same experiments, another order, the same for the same seed
    order = [e.name for e in make_tuner("random", exps, section, seed=3).order()]
    assert sorted(order) == sorted(e.name for e in exps)
    assert order == [e.name for e in make_tuner("random", exps, section, seed=3).order()]

    # model_based: the largest micro-batch of each group; the next size down after an OOM
    mb = make_tuner("model_based", exps, section)
    records = {}
    exp, _ = mb.next(records)
    assert exp.name == "z1_mbs4"
    records[exp.name] = _rec(exp, 0, "oom")
    exp, _ = mb.next(records)
    assert exp.name == "z1_mbs2"
    records[exp.name] = _rec(exp, 1, "ok", 8.0)
    exp, _ = mb.next(records)
    assert exp.name == "z2_mbs4"
    records[exp.name] = _rec(exp, 2, "ok", 9.0)
    assert mb.next(records)[0] is None  # each group has its measured point
    lat = make_tuner("model_based", exps, _section(metric="latency"))
    assert lat.next({})[0].name == "z1_mbs1"  # latency: the smallest micro-batch


def test_script_args_point_at_the_trial_config():
    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    args = ["--deepspeed_config", "user.json", "--bs=1", "--x", "y"]
    out = script_args(args, "trial.json", cfg, {"train_micro_batch_size_per_gpu": "--bs",
                                                "zero_optimization.stage": "--zero"})
    assert out == ["--deepspeed_config", "trial.json", "--bs=4", "--x", "y", "--zero", "2"]


# --- one trial's outcome, from real processes --------------------------------------------------

@pytest.mark.parametrize("code, status", [
    ("raise MemoryError('boom')", "oom"),
    ("import sys; print('RuntimeError: bad'); sys.exit(3)", "failed"),
    ("import time; time.sleep(60)", "timeout"),
    ("import json, sys; json.dump({'throughput': 2.0}, open(sys.argv[1], 'w'))", "ok"),
    # rank 0 on another host: no file here, its metrics line came back in the job's output
    ("print('[rank 0] [dslaunch] autotuning metrics: {\"throughput\": 2.0}')", "ok"),
])
def test_trial_outcomes(tmp_path, code, status):
    metric = str(tmp_path / "metric.json")
    out = run_trial([sys.executable, "-c", code, metric], str(tmp_path / "job.log"), metric,
                    timeout=3, grace=1)
    assert out["status"] == status, out
    if status == "ok":
        assert out["metrics"] == {"throughput": 2.0}
    if status == "failed":
        assert out["returncode"] == 3 and "RuntimeError: bad" in out["error"]


# --- end to end: the example on 2 ranks, killed with SIGKILL, resumed ----------------------------

def test_autotune_example_kill9_resume_finds_best(tmp_path):
    cfg = {"train_micro_batch_size_per_gpu": [1, 2, 4], "gradient_accumulation_steps": 1,
           "steps_per_print": 100, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": [2, 1], "offload_optimizer": {"device": ["none", "nvme"]}},
           "autotuning": {"enabled": True, "start_profile_step": 1, "end_profile_step": 2,
                          "max_train_batch_size": 4, "results_dir": "res", "exps_dir": "exps"}}
    (tmp_path / "tune.json").write_text(json.dumps(cfg))
    options = ["--config", "tune.json", "--nproc-per-node", "2", "--params", str(TINY_PARAMS),
               "--memory-per-rank", "340000"]
    argv = [*DSLAUNCH, "autotune", *options, str(EXAMPLES / "train_gpt.py"), *TINY]
    trials = tmp_path / "res" / "trials.json"

    def recorded():
        try:
            return json.loads(trials.read_text())["trials"]
        except (OSError, ValueError, KeyError):
            return []

    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 240
    while len(recorded()) < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(recorded()) == 1, first.communicate()[0] if first.poll() is not None else "slow"
    os.kill(first.pid, signal.SIGKILL)  # mid-search: the 2nd trial (z2_mbs2) has started
    first.wait()
    done_before = recorded()
    assert [(t["name"], t["status"]) for t in done_before] == [("z2_mbs1", "ok")]
    logs = {t["name"]: os.stat(t["log"]).st_mtime_ns for t in done_before}

    # the interrupted trial's job got SIGTERM when the tuner died: nothing of it stays
    def leftovers():
        out = []
        for p in psutil.process_iter(["cmdline"]):
            if any(str(tmp_path / "exps") in part for part in (p.info["cmdline"] or [])):
                out.append(p.pid)
        return out
    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers()

    resumed = [*DSLAUNCH, "autotune", "--resume", *options, str(EXAMPLES / "train_gpt.py"), *TINY]
    second = subprocess.run(resumed, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming: 1 trial(s) already done" in second.stdout
    after = recorded()
    assert after[:1] == done_before  # a finished trial is not run again...
    assert {t["name"]: os.stat(t["log"]).st_mtime_ns for t in after[:1]} == logs
    names = [t["name"] for t in after]
    assert sorted(names) == sorted(set(names)) and len(names) == 6  # ...and every other one once
    status = {t["name"]: t["status"] for t in after}
    assert status == {"z1_oo-nvme_mbs1": "failed", "z1_oo-nvme_mbs2": "failed", "z2_mbs1": "ok",
                      "z2_mbs2": "ok", "z2_oo-nvme_mbs1": "failed", "z2_oo-nvme_mbs2": "failed"}
    assert "nvme_path" in next(t for t in after if t["status"] == "failed")["error"]
    body = json.loads(trials.read_text())
    # the best of the two that ran, by the throughput each measured (which one is faster depends
    # on the host: on an AVX-512 host a step of micro-batch 2 costs twice one of micro-batch 1)
    fastest = max((t for t in after if t["status"] == "ok"), key=lambda t: t["metrics"]["throughput"])
    assert body["best"] == fastest["name"]
    not_run = {t["name"]: t["reason"] for t in body["not_run"]}
    assert "model states" in not_run["z1_mbs1"] and "max_train_batch_size" in not_run["z2_mbs4"]
    best = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert best["zero_optimization"]["stage"] == 2
    assert f"mbs{best['train_micro_batch_size_per_gpu']}" == fastest["name"].rsplit("_", 1)[1]
    assert "metric_path" not in best["autotuning"] and best["autotuning"]["enabled"] is False
    summary = (tmp_path / "res" / "summary.txt").read_text()
    assert all(name in summary for name in names) and "pruned" in summary
