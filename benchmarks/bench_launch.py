#!/usr/bin/env python
"""Launch overhead: wall time of the whole command for a trivial 2-rank job, dslaunch vs its peers.

The job (peer_scripts/trivial_dist.py) imports torch, runs init_process_group (gloo), a barrier,
and exits. Launchers, each with OMP_NUM_THREADS=1 and a free port:
  dslaunch   dslaunch run --nproc-per-node 2 trivial_dist.py                  (this venv)
  torchrun   torchrun --standalone --nproc-per-node 2 trivial_dist.py          (this venv)
  deepspeed  <peer venv>/deepspeed --num_gpus 2 --master_port P trivial_dist.py (when the venv exists)
plus a floor: ``python -c "import torch"`` (what any rank pays before doing anything).

Per run: the whole command's wall time, and the time from the command's start until the last rank
is past init_process_group (rank time stamps). Fail-fast: rank 1 raises after the barrier while
rank 0 sleeps; measured is the time from rank 1's failure to the launcher's exit (it must notice,
stop rank 0 and report), the exit code, and whether rank 0 survived (an orphan).

Runs are interleaved round-robin (A B C A B C ...), ``--repeats`` times (default 5); per launcher
medians, ratios dslaunch / peer. JSON to stdout and benchmarks/results/launch-<timestamp>.json.

    .venv/bin/python benchmarks/bench_launch.py [--repeats 5] [--launchers dslaunch,torchrun,deepspeed]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

TRIVIAL = bu.PEER_SCRIPTS / "trivial_dist.py"
LAUNCHERS = ("dslaunch", "torchrun", "deepspeed")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--launchers", default="dslaunch,torchrun,deepspeed",
                   help="comma list of dslaunch, torchrun, deepspeed (deepspeed skipped without its venv)")
    p.add_argument("--fail-launchers", default="dslaunch,torchrun",
                   help="launchers measured for failure-to-exit ('' for none)")
    p.add_argument("--no-floor", action="store_true", help="skip the python -c 'import torch' floor")
    p.add_argument("--create-peer-venv", action="store_true",
                   help="create the DeepSpeed venv if missing (default: use it only if it exists)")
    p.add_argument("--omp-threads", default="1")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    args.launcher_list = [x.strip() for x in args.launchers.split(",") if x.strip()]
    args.fail_list = [x.strip() for x in args.fail_launchers.split(",") if x.strip()]
    for name in args.launcher_list + args.fail_list:
        if name not in LAUNCHERS:
            p.error(f"{name!r} is not one of {', '.join(LAUNCHERS)}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def command(launcher: str, args, stamps: Path, peer_py, fail: bool) -> list:
    n = str(args.nproc)
    job = [str(TRIVIAL), "--stamps", str(stamps)] + (["--fail-rank", "1"] if fail else [])
    if launcher == "floor":
        return [sys.executable, "-c", "import torch"]
    if launcher == "dslaunch":
        exe = bu.venv_bin("dslaunch")
        pre = [exe] if exe else [sys.executable, "-m", "dslaunch"]
        return pre + ["run", "--nproc-per-node", n] + job
    if launcher == "torchrun":
        return [bu.venv_bin("torchrun"), "--standalone", "--nproc-per-node", n] + job
    assert launcher == "deepspeed" and peer_py
    return [str(Path(peer_py).parent / "deepspeed"), "--num_gpus", n, "--master_port", str(bu.free_port())] + job


def env_for(args) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.omp_threads)
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK"):
        env.pop(k, None)
    return env


def alive(pid: int) -> bool:
    """True if pid runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def one_run(launcher: str, args, work: Path, rep: int, peer_py, fail: bool) -> dict:
    stamps = work / f"{launcher}{'-fail' if fail else ''}-r{rep}"
    stamps.mkdir(parents=True)
    cmd = command(launcher, args, stamps, peer_py, fail)
    log_path = stamps / "launcher.log"
    with open(log_path, "wb") as logf:
        t_start = time.time()
        p0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env_for(args), cwd=bu.REPO,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        wall = time.perf_counter() - p0
        t_exit = time.time()
    run = {"launcher": launcher, "mode": "fail" if fail else "ok", "repeat": rep, "command": shlex.join(cmd),
           "returncode": rc, "wall_seconds": round(wall, 4)}
    ranks = {}
    for f in stamps.glob("rank*.json"):
        d = json.loads(f.read_text())
        ranks[d["rank"]] = d
    if launcher != "floor":
        run["ranks_reporting"] = len(ranks)
        if len(ranks) == args.nproc:
            run["all_ranks_past_init_seconds"] = round(max(d["init_done"] for d in ranks.values()) - t_start, 4)
            run["first_rank_script_start_seconds"] = round(min(d["start"] for d in ranks.values()) - t_start, 4)
    if fail:
        failed = ranks.get(1, {}).get("failed_at")
        run["failure_to_exit_seconds"] = round(t_exit - failed, 4) if failed else None
        survivor = ranks.get(0, {}).get("pid")
        run["orphan_left"] = bool(survivor and alive(survivor))
        if run["orphan_left"]:
            os.kill(survivor, signal.SIGKILL)  # our own job's rank: clean it up
        run["ok"] = rc not in (0, "timeout") and failed is not None and not run["orphan_left"]
    else:
        run["ok"] = rc == 0 and (launcher == "floor" or len(ranks) == args.nproc)
    if rc == "timeout":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if not run["ok"]:
        run["log_tail"] = log_path.read_text(errors="replace")[-1500:]
    return run


def summarise(runs: list, launchers: list, fail_launchers: list) -> dict:
    def pick(launcher, mode, key):
        return [r[key] for r in runs if r["launcher"] == launcher and r["mode"] == mode and r["ok"]
                and r.get(key) is not None]

    out = {"launch": {}, "fail_fast": {}}
    for name in launchers:
        walls = pick(name, "ok", "wall_seconds")
        out["launch"][name] = {"runs_ok": len(walls),
                               "runs_failed": len([r for r in runs if r["launcher"] == name and r["mode"] == "ok"
                                                   and not r["ok"]]),
                               "wall_seconds_median": _r(bu.median(walls)), "wall_seconds_runs": walls,
                               "all_ranks_past_init_seconds_median":
                                   _r(bu.median(pick(name, "ok", "all_ranks_past_init_seconds")))}
    for name in fail_launchers:
        vals = pick(name, "fail", "failure_to_exit_seconds")
        out["fail_fast"][name] = {"runs_ok": len(vals),
                                  "failure_to_exit_seconds_median": _r(bu.median(vals)),
                                  "failure_to_exit_seconds_runs": vals,
                                  "wall_seconds_median": _r(bu.median(pick(name, "fail", "wall_seconds"))),
                                  "returncodes": sorted({str(r["returncode"]) for r in runs
                                                         if r["launcher"] == name and r["mode"] == "fail"}),
                                  "orphans": sum(1 for r in runs if r["launcher"] == name and r.get("orphan_left"))}
    ds = out["launch"].get("dslaunch", {})
    out["ratios"] = {}
    for name in launchers:
        if name in ("dslaunch", "floor"):
            continue
        out["ratios"][f"dslaunch/{name}"] = {
            "wall": bu.ratio(ds.get("wall_seconds_median"), out["launch"][name]["wall_seconds_median"]),
            "all_ranks_past_init": bu.ratio(ds.get("all_ranks_past_init_seconds_median"),
                                            out["launch"][name]["all_ranks_past_init_seconds_median"]),
        }
    dsf = out["fail_fast"].get("dslaunch", {})
    for name in fail_launchers:
        if name != "dslaunch":
            out["ratios"][f"dslaunch/{name}"] = dict(out["ratios"].get(f"dslaunch/{name}", {}),
                                                     failure_to_exit=bu.ratio(
                                                         dsf.get("failure_to_exit_seconds_median"),
                                                         out["fail_fast"][name]["failure_to_exit_seconds_median"]))
    return out


def _r(x):
    return round(x, 3) if x is not None else None


def main(argv=None) -> int:
    args = parse_args(argv)
    peer_py = None
    if "deepspeed" in args.launcher_list + args.fail_list:
        peer_py = bu.peer_python(create=args.create_peer_venv)
        if peer_py is None:
            bu.log("DeepSpeed peer venv not found (benchmarks/peers.py creates it): deepspeed skipped")
            args.launcher_list = [x for x in args.launcher_list if x != "deepspeed"]
            args.fail_list = [x for x in args.fail_list if x != "deepspeed"]
    launchers = args.launcher_list + ([] if args.no_floor else ["floor"])
    result = {
        "benchmark": "bench_launch",
        "command": shlex.join([sys.executable] + sys.argv),
        "started": bu.now_iso(),
        "machine": bu.machine(),
        "loadavg_before": bu.loadavg(),
        "versions": {"torch": bu.pkg_version("torch"), "dslaunch": bu.pkg_version("dslaunch"),
                     "deepspeed": bu.pkg_version("deepspeed", peer_py) if peer_py else None,
                     "git": bu.git_rev()},
        "threads": {"OMP_NUM_THREADS": str(args.omp_threads), "note": "set for every launcher"},
        "settings": {"nproc": args.nproc, "repeats": args.repeats, "job": "peer_scripts/trivial_dist.py",
                     "wall": "whole command, Popen to exit",
                     "failure_to_exit": "rank 1 raises after the barrier (time stamp just before), rank 0 "
                                        "sleeps; until the launcher process exits"},
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_launch-") as tmp:
        work = Path(tmp)
        # one untimed pass so every launcher starts with warm file caches
        for name in launchers:
            one_run(name, args, work / "warm", 0, peer_py, fail=False)
        for rep in range(args.repeats):
            order = [(n, False) for n in launchers] + [(n, True) for n in args.fail_list]
            for name, fail in order:
                run = one_run(name, args, work, rep, peer_py, fail)
                runs.append(run)
                extra = (f", failure->exit {run.get('failure_to_exit_seconds')} s, rc {run['returncode']}"
                         if fail else "")
                bu.log(f"[{rep + 1}/{args.repeats}] {name}{' (rank 1 fails)' if fail else ''}: "
                       f"wall {run['wall_seconds']} s{extra}{'' if run['ok'] else '  NOT OK'}")
                if not run["ok"]:
                    bu.log("    " + run.get("log_tail", "")[-600:].replace("\n", "\n    "))
    summary = summarise(runs, launchers, args.fail_list)
    result.update(finished=bu.now_iso(), loadavg_after=bu.loadavg(), summary=summary, runs=runs)
    path = None if args.no_save else bu.save_json(result, "launch", Path(args.results_dir))
    bu.log("")
    bu.log(f"{'launcher':<10} {'wall s (median)':>16} {'ranks past init s':>18}")
    for name, s in summary["launch"].items():
        bu.log(f"{name:<10} {s['wall_seconds_median']!s:>16} {s['all_ranks_past_init_seconds_median']!s:>18}")
    for name, s in summary["fail_fast"].items():
        bu.log(f"{name:<10} failure->exit {s['failure_to_exit_seconds_median']} s (median), "
               f"exit codes {s['returncodes']}, orphans {s['orphans']}")
    for k, v in summary["ratios"].items():
        bu.log(f"{k}: {v}")
    if path:
        bu.log(f"JSON written to {path}")
    print(json.dumps(result, indent=1))
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
