#!/usr/bin/env python
"""Training throughput and peak RSS per rank: dslaunch vs its peers, side by side in one run.

The model and data are the BENCHMARKING ones (examples/gpt.py ``bench_config()``: 6 layers,
hidden 512, 8 heads, vocab 8192, seq 128, 27.4M params; deterministic TextBatches), 2 ranks,
micro-batch 4 per rank, Adam lr 1e-3, OMP_NUM_THREADS=1 for every launcher.

    .venv/bin/python benchmarks/bench_train.py                       # dslaunch stage 0 vs DDP, fp32
    .venv/bin/python benchmarks/bench_train.py --stages 0,1,2,3 --precision fp32,bf16 \
        --peers ddp,fsdp2,deepspeed                                   # the ZeRO comparison
    .venv/bin/python benchmarks/bench_train.py --smoke --repeats 1    # tiny model, seconds

Runtimes under test and how each is started:
  dslaunch   dslaunch run --nproc-per-node N benchmarks/dslaunch_train.py --stage S   (this venv)
  ddp        torchrun --standalone ... peer_scripts/ddp_train.py      (DDP + Adam fused=True)
  fsdp2      torchrun --standalone ... peer_scripts/fsdp2_train.py    (fully_shard per block + root)
  deepspeed  <peer venv>/torchrun --standalone ... peer_scripts/deepspeed_train.py --stage S
             (or --ds-launcher deepspeed: DeepSpeed's own launcher)
Stages may carry "+offload" (offload_optimizer: cpu), e.g. ``--stages 0,2,2+offload``.

Runs are interleaved round-robin over the configurations, ``--repeats`` times. Per run: tokens/s
= tokens per step / median step time over the timed steps (a step's time is the slowest rank's),
peak RSS per rank (ru_maxrss), the per-step losses. Per configuration: medians over repeats;
ratios dslaunch / peer (same precision, and same stage for DeepSpeed). A dslaunch stage that is
not implemented yet is reported as "not supported" (from its config error), not a crash.
JSON goes to stdout and to benchmarks/results/train-<timestamp>.json; the tables to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu
from zero_config import train_config

RUNTIMES = ("dslaunch", "ddp", "fsdp2", "deepspeed")
STAGED = ("dslaunch", "deepspeed")
UNSUPPORTED_EXIT = 3  # dslaunch_train.py's


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--stages", default="0", help="ZeRO stages for dslaunch and DeepSpeed, e.g. 0,1,2,3,2+offload")
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or both: fp32,bf16")
    p.add_argument("--peers", default="ddp", help="comma list of ddp, fsdp2, deepspeed ('' for none)")
    p.add_argument("--no-dslaunch", action="store_true", help="run the peers only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 20; smoke 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; smoke 1)")
    p.add_argument("--nproc", type=int, default=2, help="ranks")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank trains on its own GPU (nccl); peak GPU memory is reported too")
    p.add_argument("--peer-python", default=None,
                   help="a python that imports deepspeed (else benchmarks/peers.py makes the peer venv); its "
                        "ranks start with `PYTHON -m torch.distributed.run`")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS for every launcher (default 1)")
    p.add_argument("--smoke", action="store_true", help="tiny model and few steps: checks the plumbing")
    p.add_argument("--ds-launcher", choices=["torchrun", "deepspeed"], default="torchrun",
                   help="how the DeepSpeed peer is started (its training is the same either way)")
    p.add_argument("--no-warmup-runs", action="store_true",
                   help="skip the untimed first run per runtime (compiles DeepSpeed's ops, fills caches)")
    p.add_argument("--show-losses", type=int, default=5, help="losses printed per configuration")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--results-dir", default=str(bu.RESULTS), help="where train-<timestamp>.json goes")
    p.add_argument("--no-save", action="store_true", help="JSON to stdout only")
    p.add_argument("--keep-logs", action="store_true", help="keep each run's directory (printed)")
    p.add_argument("--zero-extra", default="",
                   help="JSON object merged into zero_optimization for dslaunch and DeepSpeed alike, "
                        "e.g. '{\"stage3_max_reuse_distance\": 0}' (passed as BENCH_ZERO_EXTRA)")
    args = p.parse_args(argv)
    if args.zero_extra:
        try:
            extra = json.loads(args.zero_extra)
        except ValueError as exc:
            p.error(f"--zero-extra: not JSON ({exc})")
        if not isinstance(extra, dict):
            p.error("--zero-extra: must be a JSON object of zero_optimization keys")
    if args.steps is None:
        args.steps = 3 if args.smoke else 20
    if args.warmup is None:
        args.warmup = 1 if args.smoke else 5
    args.stage_list = [_parse_stage(s) for s in bu.split(args.stages)]
    args.precision_list = bu.split(args.precision)
    for prec in args.precision_list:
        if prec not in ("fp32", "bf16"):
            p.error(f"--precision: {prec!r} is not fp32 or bf16")
    args.peer_list = bu.split(args.peers)
    for peer in args.peer_list:
        if peer not in RUNTIMES[1:]:
            p.error(f"--peers: {peer!r} is not one of ddp, fsdp2, deepspeed")
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--repeats and --steps must be >= 1, --warmup >= 0")
    return args




def _parse_stage(text: str):
    base, _, extra = text.partition("+")
    if base not in ("0", "1", "2", "3") or extra not in ("", "offload"):
        raise SystemExit(f"--stages: {text!r} is not a stage 0-3, optionally with +offload")
    return int(base), extra == "offload"


# ---------------------------------------------------------------------------------- configurations


def configurations(args) -> list:
    """Every configuration once, in the order of a round: dslaunch then its peers, per precision."""
    out = []
    for prec in args.precision_list:
        runtimes = ([] if args.no_dslaunch else ["dslaunch"]) + args.peer_list
        for rt in runtimes:
            if rt in STAGED:
                for stage, offload in args.stage_list:
                    out.append({"runtime": rt, "stage": stage, "offload": offload, "precision": prec})
            else:
                out.append({"runtime": rt, "stage": None, "offload": False, "precision": prec})
    for c in out:
        c["name"] = config_name(c)
    return out


def config_name(c) -> str:
    if c["stage"] is None:
        return f"{c['runtime']}/{c['precision']}"
    return f"{c['runtime']}/z{c['stage']}{'+offload' if c['offload'] else ''}/{c['precision']}"


def dslaunch_precheck(c, args) -> str | None:
    """The config error's text if dslaunch's config layer calls this configuration unsupported."""
    from dslaunch.config import ConfigError, resolve_config

    cfg = train_config(c["stage"], c["precision"], c["offload"], args.micro_batch, args.lr)
    try:
        resolve_config(cfg, world_size=args.nproc, check_supported=True)
    except ConfigError as exc:
        text = str(exc)
        return text if "not supported" in text else None
    except Exception:
        return None
    return None


def command(c, args, out_dir: Path, peer_py: str | None, smoke_warmup: bool = False) -> list:
    n = str(args.nproc)
    script_args = ["--out", str(out_dir), "--precision", c["precision"], "--micro-batch", str(args.micro_batch),
                   "--lr", str(args.lr), "--device", args.device]
    if smoke_warmup:
        script_args += ["--smoke", "--steps", "1", "--warmup", "1"]
    else:
        script_args += ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--smoke"] if args.smoke else [])
    if c["stage"] is not None:
        script_args += ["--stage", str(c["stage"])] + (["--offload"] if c["offload"] else [])
    rt = c["runtime"]
    if rt == "dslaunch":
        launcher = bu.venv_bin("dslaunch")
        pre = [launcher] if launcher else [sys.executable, "-m", "dslaunch"]
        return pre + ["run", "--nproc-per-node", n, str(bu.HERE / "dslaunch_train.py")] + script_args
    if rt in ("ddp", "fsdp2"):
        return [bu.venv_bin("torchrun"), "--standalone", "--nproc-per-node", n,
                str(bu.PEER_SCRIPTS / f"{rt}_train.py")] + script_args
    assert rt == "deepspeed" and peer_py
    peer_bin = Path(peer_py).parent
    script = str(bu.PEER_SCRIPTS / "deepspeed_train.py")
    if args.peer_python:
        return [peer_py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, script] + script_args
    if args.ds_launcher == "deepspeed":
        return [str(peer_bin / "deepspeed"), "--num_gpus", n, "--master_port", str(bu.free_port()),
                script] + script_args
    return [str(peer_bin / "torchrun"), "--standalone", "--nproc-per-node", n, script] + script_args


def run_env(args) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.omp_threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("BENCH_ZERO_EXTRA", None)
    env["DSLAUNCH_ACCELERATOR"] = args.device  # the same device for dslaunch as for its peers
    if args.zero_extra:  # zero_config.train_config merges it, in every runtime's script
        env["BENCH_ZERO_EXTRA"] = args.zero_extra
    # the peers must not see dslaunch's launcher variables if this harness runs inside a job
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK"):
        env.pop(k, None)
    return env


# --------------------------------------------------------------------------------------- one run


def one_run(c, args, work: Path, rep: int, peer_py, smoke_warmup=False) -> dict:
    tag = c["name"].replace("/", "_") + (f"_r{rep}" if not smoke_warmup else "_warmup")
    out_dir = work / tag
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = command(c, args, out_dir, peer_py, smoke_warmup)
    log_path = out_dir / "launcher.log"
    rc, wall = bu.run_logged(cmd, log_path, run_env(args), args.timeout)
    run = {"config": c["name"], "repeat": rep, "command": shlex.join(cmd), "returncode": rc,
           "wall_seconds": round(wall, 3)}
    ranks = []
    for r in range(args.nproc):
        f = out_dir / f"rank{r}.json"
        if f.exists():
            ranks.append(json.loads(f.read_text()))
    log_tail = log_path.read_text(errors="replace")[-3000:]
    if (out_dir / "unsupported.json").exists() or (rc == UNSUPPORTED_EXIT and "not supported" in log_tail):
        msg = (json.loads((out_dir / "unsupported.json").read_text())["message"]
               if (out_dir / "unsupported.json").exists() else _last_line_with(log_tail, "not supported"))
        run.update(status="not supported", message=msg)
        return run
    if rc != 0 or len(ranks) != args.nproc:
        run.update(status="failed", message=f"exit {rc}, {len(ranks)}/{args.nproc} rank results",
                   log_tail=log_tail[-1500:])
        return run
    run.update(status="ok", **summarise_ranks(ranks))
    if args.keep_logs:
        run["dir"] = str(out_dir)
    return run




def _last_line_with(text: str, needle: str) -> str:
    lines = [ln for ln in text.splitlines() if needle in ln]
    return lines[-1].strip() if lines else needle


def summarise_ranks(ranks: list) -> dict:
    ranks = sorted(ranks, key=lambda r: r["rank"])
    r0 = ranks[0]
    warm = r0["warmup"]
    n_steps = min(len(r["step_seconds"]) for r in ranks)
    slowest = [max(r["step_seconds"][i] for r in ranks) for i in range(warm, n_steps)]
    step_med = bu.median(slowest)
    return {
        "tokens_per_step": r0["tokens_per_step"],
        "timed_steps": len(slowest),
        "step_seconds_median": round(step_med, 5),
        "tokens_per_s": round(r0["tokens_per_step"] / step_med, 2),
        "tokens_per_s_total": round(r0["tokens_per_step"] * len(slowest) / sum(slowest), 2),
        "peak_rss_mb_per_rank": [round(r["peak_rss_bytes"] / 2**20, 1) for r in ranks],
        "peak_rss_mb_max": round(max(r["peak_rss_bytes"] for r in ranks) / 2**20, 1),
        "gpu_peak_mb_max": (round(max(r["gpu_peak_allocated_bytes"] for r in ranks) / 2**20, 1)
                            if "gpu_peak_allocated_bytes" in r0 else None),
        "gpu": r0.get("gpu"),
        "losses": r0["losses"],
        "torch_threads_per_rank": [r["torch_threads"] for r in ranks],
        "omp_num_threads_per_rank": [r["omp_num_threads"] for r in ranks],
        "num_params": r0.get("num_params"),
        "rank_extra": {k: r0[k] for k in ("optimizer", "basic_optimizer", "deepspeed", "dslaunch", "memory_breakdown",
                                          "wrap") if k in r0},
    }


# ----------------------------------------------------------------------------------------- summary


def summarise(configs, runs, args) -> list:
    by = {c["name"]: [r for r in runs if r["config"] == c["name"]] for c in configs}
    rows = []
    for c in configs:
        rs = by[c["name"]]
        ok = [r for r in rs if r["status"] == "ok"]
        row = {k: c[k] for k in ("name", "runtime", "stage", "offload", "precision")}
        if not ok:
            row["status"] = rs[0]["status"] if rs else "not run"
            row["message"] = rs[0].get("message") if rs else None
            rows.append(row)
            continue
        row.update(status="ok", runs=len(ok),
                   tokens_per_s_median=round(bu.median([r["tokens_per_s"] for r in ok]), 1),
                   tokens_per_s_runs=[r["tokens_per_s"] for r in ok],
                   peak_rss_mb_median=round(bu.median([r["peak_rss_mb_max"] for r in ok]), 1),
                   losses=ok[0]["losses"])
        if ok[0].get("gpu_peak_mb_max") is not None:
            row["gpu_peak_mb_median"] = round(bu.median([r["gpu_peak_mb_max"] for r in ok]), 1)
        rows.append(row)
    index = {r["name"]: r for r in rows}
    for row in rows:
        if row["status"] != "ok":
            continue
        ref = index.get(f"ddp/{row['precision']}")
        if ref and ref["status"] == "ok" and row["runtime"] != "ddp":
            row["loss_max_abs_diff_vs_ddp"] = bu.loss_diff(row["losses"], ref["losses"])
        if row["runtime"] != "dslaunch":
            continue
        row["ratios"] = {}
        peers = [f"ddp/{row['precision']}", f"fsdp2/{row['precision']}",
                 config_name({"runtime": "deepspeed", "stage": row["stage"], "offload": row["offload"],
                              "precision": row["precision"]})]
        for peer_name in peers:
            peer = index.get(peer_name)
            if not peer or peer["status"] != "ok":
                continue
            key = peer_name.split("/")[0]
            row["ratios"][key] = {
                "tokens_per_s": bu.ratio(row["tokens_per_s_median"], peer["tokens_per_s_median"]),
                "tokens_per_s_paired": bu.paired(by[row["name"]], by[peer_name], "tokens_per_s"),
                "peak_rss": bu.ratio(row["peak_rss_mb_median"], peer["peak_rss_mb_median"]),
                "loss_max_abs_diff": bu.loss_diff(row["losses"], peer["losses"]),
            }
            if row.get("gpu_peak_mb_median") and peer.get("gpu_peak_mb_median"):
                row["ratios"][key]["gpu_peak_mem"] = bu.ratio(row["gpu_peak_mb_median"], peer["gpu_peak_mb_median"])
    return rows






def print_tables(rows, args) -> None:
    bu.log("")
    bu.log(f"{'configuration':<26} {'status':<14} {'tokens/s':>9} {'peak RSS MB':>12}  ratios (dslaunch / peer)")
    for r in rows:
        if r["status"] != "ok":
            bu.log(f"{r['name']:<26} {r['status']:<14} {(r.get('message') or '')[:90]}")
            continue
        ratios = "  ".join(f"{k} {v['tokens_per_s']}x (rss {v['peak_rss']}x" +
                           (f", gpu mem {v['gpu_peak_mem']}x" if "gpu_peak_mem" in v else "") +
                           f", loss diff {v['loss_max_abs_diff']:.1e})" for k, v in r.get("ratios", {}).items())
        gpu = f" gpu {r['gpu_peak_mb_median']} MB" if "gpu_peak_mb_median" in r else ""
        bu.log(f"{r['name']:<26} {'ok':<14} {r['tokens_per_s_median']:>9} {r['peak_rss_mb_median']:>12}{gpu}  {ratios}")
    bu.log("")
    bu.log(f"first {args.show_losses} losses (rank 0's micro-batch), and max |loss - DDP's| over all steps:")
    for r in rows:
        if r["status"] == "ok":
            losses = " ".join(f"{x:.6f}" for x in r["losses"][: args.show_losses])
            diff = r.get("loss_max_abs_diff_vs_ddp")
            bu.log(f"  {r['name']:<26} {losses}" + (f"   max diff {diff:.2e}" if diff is not None else ""))


# -------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    configs = configurations(args)
    if not configs:
        bu.log("nothing to run")
        return 2
    peer_py = None
    if any(c["runtime"] == "deepspeed" for c in configs):
        peer_py = args.peer_python or bu.peer_python(create=True)
        if peer_py is None:
            bu.log("DeepSpeed peer venv unavailable: its configurations are skipped")
            configs = [c for c in configs if c["runtime"] != "deepspeed"]
    result = {
        "benchmark": "bench_train",
        "command": shlex.join([sys.executable] + sys.argv),
        "started": bu.now_iso(),
        "machine": bu.machine(),
        "loadavg_before": bu.loadavg(),
        "versions": {"torch": bu.pkg_version("torch"), "dslaunch": bu.pkg_version("dslaunch"),
                     "deepspeed": bu.pkg_version("deepspeed", peer_py) if peer_py else None,
                     "torch_peer_venv": bu.pkg_version("torch", peer_py) if peer_py else None,
                     "git": bu.git_rev()},
        "threads": {"OMP_NUM_THREADS": str(args.omp_threads), "note": "set for every launcher"},
        "settings": {"model": "examples/gpt.py tiny smoke model" if args.smoke else
                     "examples/gpt.py bench_config(): 6 layers, hidden 512, 8 heads, vocab 8192, seq 128",
                     "data": "TextBatches(stdlib bytes), global batch = micro_batch x ranks, seed 0",
                     "nproc": args.nproc, "device": args.device, "micro_batch": args.micro_batch, "lr": args.lr,
                     "steps": args.steps,
                     "warmup": args.warmup, "repeats": args.repeats, "smoke": args.smoke,
                     "ds_launcher": args.ds_launcher, "zero_extra": args.zero_extra or None,
                     "optimizer": "Adam (torch fused=True for DDP/FSDP2; "
                     "config optimizer.type=Adam for dslaunch and DeepSpeed)",
                     "tokens_per_s": "tokens per step / median over timed steps of the slowest rank's step time"},
        "configurations": [c["name"] for c in configs],
    }
    unsupported = {}
    for c in configs:
        if c["runtime"] == "dslaunch":
            msg = dslaunch_precheck(c, args)
            if msg:
                unsupported[c["name"]] = msg
    runs = []
    failed_first = set()
    with tempfile.TemporaryDirectory(prefix="bench_train-") as tmp:
        work = Path(tmp)
        if args.keep_logs:
            work = Path(tempfile.mkdtemp(prefix="bench_train-logs-"))
            bu.log(f"run directories under {work}")
        if not args.no_warmup_runs:
            seen = set()
            for c in configs:
                key = (c["runtime"], c["offload"])
                if key in seen or c["name"] in unsupported:
                    continue
                seen.add(key)
                bu.log(f"warm-up run (untimed, tiny model): {c['name']}")
                w = one_run(c, args, work, 0, peer_py, smoke_warmup=True)
                if w["status"] == "failed":
                    bu.log(f"  warm-up failed: {w['message']}\n{w.get('log_tail', '')[-800:]}")
        for rep in range(args.repeats):
            for c in configs:
                if c["name"] in failed_first:
                    continue  # failed in the first round: later rounds would only fail again
                if c["name"] in unsupported:
                    if rep == 0:
                        runs.append({"config": c["name"], "repeat": rep, "status": "not supported",
                                     "message": unsupported[c["name"]]})
                    continue
                bu.log(f"[{rep + 1}/{args.repeats}] {c['name']} ...")
                run = one_run(c, args, work, rep, peer_py)
                runs.append(run)
                if run["status"] == "ok":
                    bu.log(f"    {run['tokens_per_s']} tokens/s, peak RSS {run['peak_rss_mb_per_rank']} MB, "
                           f"wall {run['wall_seconds']} s, losses {[round(x, 5) for x in run['losses'][:3]]}")
                else:
                    bu.log(f"    {run['status']}: {run.get('message')}")
                    if run["status"] == "not supported":
                        unsupported[c["name"]] = run.get("message")
                    elif rep == 0:
                        failed_first.add(c["name"])
                    if run["status"] == "failed" and run.get("log_tail"):
                        bu.log("    " + run["log_tail"][-800:].replace("\n", "\n    "))
    rows = summarise(configs, runs, args)
    result.update(finished=bu.now_iso(), loadavg_after=bu.loadavg(), summary=rows, runs=runs)
    bad_threads = [r["config"] for r in runs if r.get("status") == "ok"
                   and any(t != 1 for t in r["torch_threads_per_rank"]) and str(args.omp_threads) == "1"]
    if bad_threads:
        result["warnings"] = [f"torch threads != 1 in {sorted(set(bad_threads))}"]
    path = None if args.no_save else bu.save_json(result, "train", Path(args.results_dir))
    print_tables(rows, args)
    if path:
        bu.log(f"\nJSON written to {path}")
    print(json.dumps(result, indent=1))
    failed = [r for r in runs if r.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
