#!/usr/bin/env python
"""The Hugging Face Trainer on dslaunch's engine vs on DeepSpeed's engine, side by side in one run.

The same rank script (peer_scripts/hf_trainer_rank.py: a small GPT-2 built from its config, 4
layers, hidden 256, 4 heads, vocab 8192, seq 128; ``TrainingArguments(deepspeed=CFG)`` with a
Transformers-style "auto" config, AdamW from the config, constant lr 1e-3, micro-batch 4 per rank,
no accumulation), 2 ranks, OMP_NUM_THREADS=1, started two ways:

  dslaunch   dslaunch run --as-deepspeed --nproc-per-node N hf_trainer_rank.py ...   (this venv)
  deepspeed  <peer venv>/torchrun --standalone --nproc-per-node N hf_trainer_rank.py ...
             (DeepSpeed 0.19.8 with transformers and accelerate in its own venv, benchmarks/peers.py)

    .venv/bin/python benchmarks/bench_hf_trainer.py                    # ZeRO-2/3 x fp32/bf16, both engines
    .venv/bin/python benchmarks/bench_hf_trainer.py --steps 20 --repeats 2
    .venv/bin/python benchmarks/bench_hf_trainer.py --smoke --no-deepspeed   # tiny model, dslaunch only

Runs are interleaved: each round runs every configuration once, dslaunch and DeepSpeed adjacent for
the same stage and precision. Per run: samples/s = samples per optimizer step / median over the
timed steps of the slowest rank's step time (steps timed inside train() by a TrainerCallback,
start-up and ``--warmup`` steps excluded); the Trainer's own train_samples_per_second (warm-up
included) beside it; peak RSS per rank (ru_maxrss); the logged losses. Per configuration: medians
over rounds; ratios dslaunch / DeepSpeed (issue target: samples/s >= 1.1x at peak RSS <= 1.0x).
JSON goes to stdout and to benchmarks/results/hf_trainer-<timestamp>.json; the table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

RANK_SCRIPT = bu.PEER_SCRIPTS / "hf_trainer_rank.py"
RUNTIMES = ("dslaunch", "deepspeed")
ENGINE_MODULE = {"dslaunch": "dslaunch.", "deepspeed": "deepspeed."}  # who must have trained
TARGET = {"samples_per_s": 1.1, "peak_rss": 1.0}

# Transformers-style configs: the Trainer fills every "auto" from its arguments and the model
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "steps_per_print": 1_000_000}
ZERO = {2: {"stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"},
        3: {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": True}}


def ds_config(stage: int) -> dict:
    return {**AUTO, "zero_optimization": dict(ZERO[stage])}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--stages", default="2,3", help="ZeRO stages, of 2 and 3")
    p.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 or both: fp32,bf16")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 20; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; smoke 1)")
    p.add_argument("--nproc", type=int, default=2, help="ranks")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS for both (default 1)")
    p.add_argument("--no-deepspeed", action="store_true", help="dslaunch only (no peer venv needed)")
    p.add_argument("--peer-python", default=None,
                   help="a python with deepspeed, transformers and accelerate (else benchmarks/peers.py's venv, "
                        "DSLAUNCH_PEER_VENV); its ranks start with `PYTHON -m torch.distributed.run`")
    p.add_argument("--smoke", action="store_true", help="tiny GPT-2 and few steps: checks the plumbing")
    p.add_argument("--no-warmup-runs", action="store_true",
                   help="skip the untimed tiny run per runtime first (compiles DeepSpeed's ops, fills caches)")
    p.add_argument("--show-losses", type=int, default=5, help="losses printed per configuration")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--results-dir", default=str(bu.RESULTS), help="where hf_trainer-<timestamp>.json goes")
    p.add_argument("--no-save", action="store_true", help="JSON to stdout only")
    p.add_argument("--keep-logs", action="store_true", help="keep each run's directory (printed)")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.smoke else 20
    if args.warmup is None:
        args.warmup = 1 if args.smoke else 3
    args.stage_list = [_int_in(s, (2, 3), "--stages", p) for s in bu.split(args.stages)]
    args.precision_list = bu.split(args.precision)
    for prec in args.precision_list:
        if prec not in ("fp32", "bf16"):
            p.error(f"--precision: {prec!r} is not fp32 or bf16")
    if args.repeats < 1 or args.steps < 1 or args.warmup < 1:
        p.error("--repeats, --steps and --warmup must be >= 1 (the first step's time holds the engine's lazy set-up)")
    return args




def _int_in(text, allowed, flag, p):
    if not text.isdigit() or int(text) not in allowed:
        p.error(f"{flag}: {text!r} is not one of {', '.join(map(str, allowed))}")
    return int(text)


def configurations(args) -> list:
    """One round: per precision and stage, dslaunch then DeepSpeed (adjacent in time)."""
    runtimes = ["dslaunch"] + ([] if args.no_deepspeed else ["deepspeed"])
    out = []
    for prec in args.precision_list:
        for stage in args.stage_list:
            for rt in runtimes:
                out.append({"runtime": rt, "stage": stage, "precision": prec, "name": f"{rt}/z{stage}/{prec}"})
    return out


# --------------------------------------------------------------------------------------- one run


def command(c, args, cfg_path: Path, out_dir: Path, peer_py, warmup_run=False) -> list:
    n = str(args.nproc)
    script = [str(RANK_SCRIPT), "--deepspeed", str(cfg_path), "--out", str(out_dir),
              "--micro-batch", str(args.micro_batch)]
    if warmup_run:
        script += ["--smoke", "--steps", "1", "--warmup", "1"]
    else:
        script += ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--smoke"] if args.smoke else [])
    if c["precision"] == "bf16":
        script.append("--bf16")
    if c["runtime"] == "dslaunch":
        launcher = bu.venv_bin("dslaunch")
        pre = [launcher] if launcher else [sys.executable, "-m", "dslaunch"]
        return pre + ["run", "--as-deepspeed", "--nproc-per-node", n] + script
    if args.peer_python:
        return [peer_py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n] + script
    return [str(Path(peer_py).parent / "torchrun"), "--standalone", "--nproc-per-node", n] + script


def run_env(c, args) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.omp_threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # neither side may inherit a job's launcher variables if this harness runs inside one
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK", "DSLAUNCH_AS_DEEPSPEED"):
        env.pop(k, None)
    if c["runtime"] == "dslaunch":  # the ranks import this checkout's dslaunch
        env["PYTHONPATH"] = os.pathsep.join([str(bu.REPO)] + [x for x in [env.get("PYTHONPATH")] if x])
    else:  # the peer venv's own packages only: nothing of this checkout on its path
        env.pop("PYTHONPATH", None)
    return env


def one_run(c, args, work: Path, rep: int, peer_py, warmup_run=False) -> dict:
    out_dir = work / (c["name"].replace("/", "_") + ("_warmup" if warmup_run else f"_r{rep}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / "ds_config.json"
    cfg_path.write_text(json.dumps(ds_config(c["stage"]), indent=1))
    cmd = command(c, args, cfg_path, out_dir, peer_py, warmup_run)
    log_path = out_dir / "launcher.log"
    rc, wall = bu.run_logged(cmd, log_path, run_env(c, args), args.timeout)
    run = {"config": c["name"], "repeat": rep, "command": shlex.join(cmd), "returncode": rc,
           "wall_seconds": round(wall, 3)}
    ranks = [json.loads(f.read_text()) for f in sorted(out_dir.glob("rank*.json"))]
    log_tail = log_path.read_text(errors="replace")[-3000:]
    if rc != 0 or len(ranks) != args.nproc:
        run.update(status="failed", message=f"exit {rc}, {len(ranks)}/{args.nproc} rank results",
                   log_tail=log_tail[-1500:])
        return run
    modules = {r["engine_module"] for r in ranks}
    if not all(m.startswith(ENGINE_MODULE[c["runtime"]]) for m in modules):
        run.update(status="wrong engine", message=f"trained on {sorted(modules)}, not {c['runtime']}'s engine")
        return run
    run.update(status="ok", **summarise_ranks(ranks))
    if args.keep_logs:
        run["dir"] = str(out_dir)
    return run




def step_seconds(rank: dict) -> list:
    """Each optimizer step's time: since the previous step's end (the first: since train begin)."""
    stamps = [rank["train_begin"]] + rank["step_ends"]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def summarise_ranks(ranks: list) -> dict:
    ranks = sorted(ranks, key=lambda r: r["rank"])
    r0 = ranks[0]
    per_rank = [step_seconds(r) for r in ranks]
    n = min(len(s) for s in per_rank)
    slowest = [max(s[i] for s in per_rank) for i in range(r0["warmup"], n)]
    med = bu.median(slowest)
    return {
        "samples_per_step": r0["samples_per_step"],
        "timed_steps": len(slowest),
        "step_seconds_median": round(med, 5),
        "samples_per_s": round(r0["samples_per_step"] / med, 3),
        "samples_per_s_mean": round(r0["samples_per_step"] * len(slowest) / sum(slowest), 3),
        "trainer_train_samples_per_second": r0["trainer_train_samples_per_second"],
        "peak_rss_mb_per_rank": [round(r["peak_rss_bytes"] / 2**20, 1) for r in ranks],
        "peak_rss_mb_max": round(max(r["peak_rss_bytes"] for r in ranks) / 2**20, 1),
        "losses": r0["losses"],
        "torch_threads_per_rank": [r["torch_threads"] for r in ranks],
        "engine": {k: r0[k] for k in ("engine_module", "engine_class", "deepspeed_version", "optimizer",
                                      "basic_optimizer", "param_dtype", "num_params")},
    }


# ----------------------------------------------------------------------------------------- summary


def summarise(configs, runs) -> list:
    by = {c["name"]: [r for r in runs if r["config"] == c["name"]] for c in configs}
    rows = []
    for c in configs:
        rs = by[c["name"]]
        ok = [r for r in rs if r["status"] == "ok"]
        row = {k: c[k] for k in ("name", "runtime", "stage", "precision")}
        if not ok:
            row.update(status=rs[0]["status"] if rs else "not run", message=rs[0].get("message") if rs else None)
            rows.append(row)
            continue
        row.update(status="ok", runs=len(ok),
                   samples_per_s_median=round(bu.median([r["samples_per_s"] for r in ok]), 2),
                   samples_per_s_runs=[r["samples_per_s"] for r in ok],
                   trainer_samples_per_s_median=_round(bu.median([r["trainer_train_samples_per_second"] for r in ok])),
                   peak_rss_mb_median=round(bu.median([r["peak_rss_mb_max"] for r in ok]), 1),
                   peak_rss_mb_per_rank=ok[0]["peak_rss_mb_per_rank"],
                   losses=ok[0]["losses"], engine=ok[0]["engine"])
        rows.append(row)
    index = {r["name"]: r for r in rows}
    for row in rows:
        peer = index.get(f"deepspeed/z{row['stage']}/{row['precision']}")
        if row["runtime"] != "dslaunch" or row["status"] != "ok" or not peer or peer["status"] != "ok":
            continue
        r = {"samples_per_s": bu.ratio(row["samples_per_s_median"], peer["samples_per_s_median"]),
             "samples_per_s_paired": bu.paired(by[row["name"]], by[peer["name"]], "samples_per_s"),
             "trainer_samples_per_s": bu.ratio(row["trainer_samples_per_s_median"],
                                               peer["trainer_samples_per_s_median"]),
             "peak_rss": bu.ratio(row["peak_rss_mb_median"], peer["peak_rss_mb_median"]),
             "loss_max_abs_diff": bu.loss_diff(row["losses"], peer["losses"])}
        r["target_met"] = (r["samples_per_s"] >= TARGET["samples_per_s"] and r["peak_rss"] <= TARGET["peak_rss"])
        row["vs_deepspeed"] = r
    return rows


def _round(x, nd=2):
    return None if x is None else round(x, nd)






def print_tables(rows, args) -> None:
    bu.log("")
    bu.log(f"{'configuration':<22} {'status':<8} {'samples/s':>10} {'trainer s/s':>12} {'peak RSS MB':>12}"
           "  dslaunch / DeepSpeed")
    for r in rows:
        if r["status"] != "ok":
            bu.log(f"{r['name']:<22} {r['status']:<8} {(r.get('message') or '')[:90]}")
            continue
        v = r.get("vs_deepspeed")
        vs = (f"samples/s {v['samples_per_s']}x {v['samples_per_s_paired']}, rss {v['peak_rss']}x, "
              f"loss diff {v['loss_max_abs_diff']:.1e}, target {'met' if v['target_met'] else 'not met'}"
              if v else "")
        bu.log(f"{r['name']:<22} {'ok':<8} {r['samples_per_s_median']:>10} {r['trainer_samples_per_s_median']:>12} "
               f"{r['peak_rss_mb_median']:>12}  {vs}")
    bu.log("")
    bu.log(f"first {args.show_losses} logged losses:")
    for r in rows:
        if r["status"] == "ok":
            bu.log(f"  {r['name']:<22} " + " ".join(f"{x:.5f}" for x in r["losses"][: args.show_losses]))


# -------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    configs = configurations(args)
    peer_py = None
    if not args.no_deepspeed:
        peer_py = args.peer_python or bu.peer_python(create=True)
        if peer_py and not _imports(peer_py, "deepspeed, transformers, accelerate"):
            bu.log(f"{peer_py} lacks transformers/accelerate: install them there "
                   "(`<peer venv>/bin/pip install transformers accelerate`)")
            peer_py = None
        if peer_py is None:
            bu.log("DeepSpeed peer unavailable: its configurations are skipped")
            configs = [c for c in configs if c["runtime"] != "deepspeed"]
    result = {
        "benchmark": "bench_hf_trainer",
        "command": shlex.join([sys.executable] + sys.argv),
        "started": bu.now_iso(),
        "machine": bu.machine(),
        "loadavg_before": bu.loadavg(),
        "versions": {name: bu.pkg_version(name) for name in ("torch", "transformers", "accelerate", "dslaunch")}
        | {"peer_" + name: bu.pkg_version(name, peer_py) if peer_py else None
           for name in ("deepspeed", "torch", "transformers", "accelerate")} | {"git": bu.git_rev()},
        "threads": {"OMP_NUM_THREADS": str(args.omp_threads), "note": "set for both launchers"},
        "settings": {"model": "GPT-2 from config: 2 layers, hidden 32, vocab 96, seq 16" if args.smoke else
                     "GPT-2 from config: 4 layers, hidden 256, 4 heads, vocab 8192, seq 128, no dropout",
                     "data": "random token ids (seed 1234), labels = inputs",
                     "trainer": "TrainingArguments(deepspeed=CFG), AdamW (config, 'auto' params) lr 1e-3 constant, "
                                "weight_decay 0.01, no accumulation, logging_steps 1",
                     "configs": {f"z{s}": ds_config(s) for s in args.stage_list},
                     "nproc": args.nproc, "micro_batch": args.micro_batch, "steps": args.steps,
                     "warmup": args.warmup, "repeats": args.repeats, "smoke": args.smoke,
                     "samples_per_s": "samples per optimizer step / median over timed steps of the slowest rank's "
                                      "step time (TrainerCallback stamps; start-up and warm-up steps excluded)",
                     "trainer_samples_per_s": "the Trainer's train_samples_per_second (warm-up steps included)",
                     "target": TARGET},
        "configurations": [c["name"] for c in configs],
    }
    runs = []
    failed_first = set()
    with tempfile.TemporaryDirectory(prefix="bench_hf_trainer-") as tmp:
        work = Path(tempfile.mkdtemp(prefix="bench_hf_trainer-logs-")) if args.keep_logs else Path(tmp)
        if args.keep_logs:
            bu.log(f"run directories under {work}")
        if not args.no_warmup_runs:
            firsts = {}
            for c in configs:
                firsts.setdefault(c["runtime"], c)
            for c in firsts.values():  # one per runtime
                bu.log(f"warm-up run (untimed, tiny model): {c['name']}")
                w = one_run(c, args, work, 0, peer_py, warmup_run=True)
                if w["status"] != "ok":
                    bu.log(f"  warm-up {w['status']}: {w['message']}\n{w.get('log_tail', '')[-800:]}")
        for rep in range(args.repeats):
            for c in configs:
                if c["name"] in failed_first:
                    continue  # failed in the first round: later rounds would only fail again
                bu.log(f"[{rep + 1}/{args.repeats}] {c['name']} ...")
                run = one_run(c, args, work, rep, peer_py)
                runs.append(run)
                if run["status"] == "ok":
                    bu.log(f"    {run['samples_per_s']} samples/s, peak RSS {run['peak_rss_mb_per_rank']} MB, "
                           f"wall {run['wall_seconds']} s, losses {[round(x, 5) for x in run['losses'][:3]]}")
                else:
                    bu.log(f"    {run['status']}: {run.get('message')}")
                    if rep == 0:
                        failed_first.add(c["name"])
                    if run.get("log_tail"):
                        bu.log("    " + run["log_tail"][-800:].replace("\n", "\n    "))
    for run in runs:  # results are committed: no paths of the machine that ran them
        run["command"] = _portable(run["command"], peer_py)
    result["command"] = _portable(result["command"], peer_py)
    rows = summarise(configs, runs)
    result.update(finished=bu.now_iso(), loadavg_after=bu.loadavg(), summary=rows, runs=runs)
    path = None if args.no_save else bu.save_json(result, "hf_trainer", Path(args.results_dir))
    print_tables(rows, args)
    if path:
        bu.log(f"\nJSON written to {path}")
    print(json.dumps(result, indent=1))
    return 1 if any(r["status"] != "ok" for r in runs) else 0


def _portable(text: str, peer_py) -> str:
    """Machine paths in a command line as placeholders: <repo>, <venv> (this one), <peer-venv>."""
    subs = [(str(bu.REPO), "<repo>"), (str(Path(sys.executable).parent.parent), "<venv>")]
    if peer_py:
        subs.append((str(Path(peer_py).parent.parent), "<peer-venv>"))
    for path, name in sorted(subs, key=lambda x: -len(x[0])):
        text = text.replace(path, name)
    return text


def _imports(python: str, modules: str) -> bool:
    try:
        return subprocess.run([python, "-c", f"import {modules}"], capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if __name__ == "__main__":
    sys.exit(main())
