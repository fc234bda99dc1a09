#!/usr/bin/env python
"""``dslaunch autotune`` against the exhaustive grid it replaces.

    .venv/bin/python benchmarks/bench_autotune.py            # stage 0-3 x offload none/cpu x micro 1,2,4,8
    .venv/bin/python benchmarks/bench_autotune.py --smoke    # stage 0, 2 x micro 1, 4 (a check, not a figure)

The example GPT (examples/train_gpt.py) on 2 ranks. Two real searches, each trial a ``dslaunch
run`` job that stops after ``end_profile_step``:
- ``grid``: ``tuner_type: gridsearch`` with early stopping off: every experiment of the space;
- ``tuned``: the tuner under test (default ``model_based``) on the same space.
Figures (metric: throughput; tokens/s is throughput x seq-len):
- ``chosen_vs_grid_best``: the tokens/s the grid measured for the config the tuner chose, over
  the grid's best tokens/s (both from the grid search, so run-to-run noise between the two
  searches does not enter); ``chosen_own_vs_grid_best``: the tuner's own measurement of it;
- ``time_fraction``: the tuner's total trial seconds over the grid's;
- ``chosen_vs_grid_best_remeasured``: the two configs run again ``--rounds`` times, alternated
  (median tokens/s): the comparison least exposed to load that changes during the searches;
- ``replay_on_grid``: the tuner's policy fed with the grid's own measurements (what it would run
  and pick): separates the policy from the noise between two searches on a shared machine.
Targets: chosen >= 0.95 of the best, time <= 0.40 of the grid's.

No peer: DeepSpeed's autotuner sizes its space from the GPU's memory and profiles on CUDA GPUs; on
a CPU-only host there is nothing of it to run. The machine may be shared (load average recorded).
JSON to stdout and to benchmarks/results/autotune-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "peer_scripts"))

import benchutil as bu  # noqa: E402

SEQ = 64
SCRIPT = [str(ROOT / "examples" / "train_gpt.py"), "--seq-len", str(SEQ),
          "--data-bytes", str(256 << 10), "--steps", "1000"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def remeasure(work: Path, names: list, rounds: int, timeout: float) -> dict:
    """The grid's trial configs of ``names`` run again, alternating (A B A B ...), so load that
    changes over minutes hits them alike: name -> median tokens/s."""
    sys.path.insert(0, str(ROOT))
    from dslaunch.autotune.trial import run_trial

    got = {n: [] for n in names}
    for r in range(rounds):
        for name in names:
            cfg = work / "gridsearch_exps" / f"{name}.json"
            metric = json.loads(cfg.read_text())["autotuning"]["metric_path"]
            cmd = [sys.executable, "-m", "dslaunch", "run", "--nproc-per-node", "2", "--config",
                   str(cfg), *SCRIPT]
            os.environ.update(_env())
            out = run_trial(cmd, str(work / f"remeasure-{name}-{r}.log"), metric, timeout)
            if out["status"] == "ok":
                got[name].append(out["metrics"]["tokens_per_sec"])
    return {n: bu.median(v) for n, v in got.items()}


def space(smoke: bool) -> dict:
    if smoke:
        return {"stage": [0, 2], "offload": ["none"], "micro": [1, 4]}
    return {"stage": [0, 1, 2, 3], "offload": ["none", "cpu"], "micro": [1, 2, 4, 8]}


def search(workdir: Path, tuner: str, sp: dict, early_stopping: int, steps: tuple,
           timeout: float) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": sp["micro"], "gradient_accumulation_steps": 1,
           "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
           "zero_optimization": {"stage": sp["stage"],
                                 "offload_optimizer": {"device": sp["offload"]}},
           "autotuning": {"enabled": True, "metric": "throughput", "tuner_type": tuner,
                          "tuner_early_stopping": early_stopping, "tuner_num_trials": 1000,
                          "start_profile_step": steps[0], "end_profile_step": steps[1],
                          "results_dir": f"{tuner}_results", "exps_dir": f"{tuner}_exps"}}
    path = workdir / f"{tuner}.json"
    path.write_text(json.dumps(cfg, indent=1))
    cmd = [sys.executable, "-m", "dslaunch", "autotune", "--config", str(path),
           "--nproc-per-node", "2", "--trial-timeout", str(timeout), *SCRIPT]
    env = _env()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        bu.log(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{tuner} search failed ({proc.returncode})")
    body = json.loads((workdir / f"{tuner}_results" / "trials.json").read_text())
    trials = body["trials"]
    return {"wall_s": round(wall, 2), "best": body["best"], "stop_reason": body["stop_reason"],
            "trial_seconds_total": body["trial_seconds_total"], "trials_run": len(trials),
            "trials": [{"name": t["name"], "status": t["status"], "seconds": t["seconds"],
                        "stage": t["stage"], "offload_optimizer": t["offload_optimizer"],
                        "offload_param": t["offload_param"], "micro_batch": t["micro_batch"],
                        "tokens_per_sec": (t["metrics"] or {}).get("tokens_per_sec"),
                        "throughput": (t["metrics"] or {}).get("throughput")} for t in trials]}


def replay(tuner: str, grid: dict) -> dict:
    """The tuner's choices fed with the grid's measurements instead of its own trials: which
    experiments it would run, what it would pick, and the grid seconds of those trials. The same
    policy as the real search, without the noise between two searches' measurements."""
    sys.path.insert(0, str(ROOT))
    from dslaunch.autotune.space import Experiment
    from dslaunch.autotune.tuners import best_record, make_tuner

    by_name = {t["name"]: t for t in grid["trials"]}
    exps = [Experiment(t["stage"], t["offload_optimizer"], t["offload_param"], t["micro_batch"])
            for t in grid["trials"]]
    section = argparse.Namespace(metric="throughput", tuner_early_stopping=5, tuner_num_trials=1000)
    t = make_tuner(tuner, exps, section)
    records = {}
    while True:
        exp, _ = t.next(records)
        if exp is None:
            break
        g = by_name[exp.name]
        records[exp.name] = {"name": exp.name, "index": len(records), "status": g["status"],
                             "micro_batch": exp.micro_batch, "group": list(exp.group),
                             "metrics": {"throughput": g["throughput"]} if g["throughput"] else None}
    best = best_record(records, "throughput")
    seconds = sum(by_name[n]["seconds"] for n in records)
    best_tps = by_name[grid["best"]]["tokens_per_sec"]
    return {"ran": list(records), "chosen": best["name"] if best else None,
            "chosen_vs_grid_best": bu.ratio(by_name[best["name"]]["tokens_per_sec"], best_tps)
            if best else None,
            "time_fraction": bu.ratio(seconds, grid["trial_seconds_total"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tuner", default="model_based", choices=["model_based", "random", "gridsearch"])
    ap.add_argument("--start-step", type=int, default=2)
    ap.add_argument("--end-step", type=int, default=6)
    ap.add_argument("--trial-timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=3,
                    help="re-measurements of the grid's best and the chosen config, alternated")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    sp = space(args.smoke)
    load_before = bu.loadavg()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        steps = (args.start_step, args.end_step)
        bu.log(f"grid over {sp} ...")
        grid = search(work, "gridsearch", sp, 10**6, steps, args.trial_timeout)
        bu.log(f"grid: {grid['trials_run']} trials, {grid['trial_seconds_total']:.0f} s; "
               f"{args.tuner} ...")
        tuned = search(work, args.tuner, sp, 5, steps, args.trial_timeout)
        pair = [grid["best"]] + ([tuned["best"]] if tuned["best"] != grid["best"] else [])
        again = remeasure(work, pair, args.rounds, args.trial_timeout) if grid["best"] else {}
    by_name = {t["name"]: t for t in grid["trials"]}
    best_tps = by_name[grid["best"]]["tokens_per_sec"] if grid["best"] else None
    chosen = tuned["best"]
    chosen_in_grid = by_name.get(chosen, {}).get("tokens_per_sec")
    chosen_own = next((t["tokens_per_sec"] for t in tuned["trials"] if t["name"] == chosen), None)
    result = {
        "kind": "autotune", "when": bu.now_iso(), "machine": bu.machine(), "git": bu.git_rev(),
        "loadavg_before": load_before, "loadavg_after": bu.loadavg(),
        "note": "CPU-only host shared with other jobs (see loadavg): trial timings are noisy",
        "peer": None, "peer_note": "DeepSpeed's autotuner needs CUDA GPUs (sizes the space from "
                                   "GPU memory); nothing of it runs on this CPU-only host",
        "model": "examples/train_gpt.py defaults (2 layers, d_model 128, 4 heads), seq 64",
        "ranks": 2, "space": sp, "profile_steps": list(steps), "tuner": args.tuner,
        "grid": grid, "tuned": tuned,
        "grid_best": grid["best"], "grid_best_tokens_per_sec": best_tps,
        "chosen": chosen, "chosen_tokens_per_sec_in_grid": chosen_in_grid,
        "chosen_tokens_per_sec_own": chosen_own,
        "chosen_vs_grid_best": bu.ratio(chosen_in_grid, best_tps),
        "chosen_own_vs_grid_best": bu.ratio(chosen_own, best_tps),
        "time_fraction": bu.ratio(tuned["trial_seconds_total"], grid["trial_seconds_total"]),
        "targets": {"chosen_vs_grid_best_min": 0.95, "time_fraction_max": 0.40},
    }
    result["replay_on_grid"] = replay(args.tuner, grid)
    result["remeasured_tokens_per_sec"] = again
    result["chosen_vs_grid_best_remeasured"] = bu.ratio(again.get(chosen), again.get(grid["best"]))
    result["meets_targets"] = bool(
        result["chosen_vs_grid_best"] is not None and result["chosen_vs_grid_best"] >= 0.95
        and result["time_fraction"] is not None and result["time_fraction"] <= 0.40)
    path = None if args.no_save else bu.save_json(result, "autotune", HERE / "results")
    print(json.dumps(result, indent=1))
    bu.log(f"grid best {grid['best']} {best_tps}; {args.tuner} chose {chosen} "
           f"({result['chosen_vs_grid_best']} of best in the grid's measurement, "
           f"{result['chosen_own_vs_grid_best']} by its own) in {result['time_fraction']} of the "
           f"grid's trial time" + (f" -> {path}" if path else ""))


if __name__ == "__main__":
    main()
