#!/usr/bin/env python
"""What the FLOPs profiler and the comms logger cost, dslaunch beside DeepSpeed in one run.

    .venv/bin/python benchmarks/bench_observability.py            # bench GPT, ZeRO-2, 2 ranks
    .venv/bin/python benchmarks/bench_observability.py --smoke    # tiny GPT
    .venv/bin/python benchmarks/bench_observability.py --no-peer  # dslaunch only

Both runtimes run ``peer_scripts/observability_rank.py`` (the same code, through the API they
share): dslaunch under ``dslaunch run``, DeepSpeed 0.19.8 (``peers.py``'s venv) under its
``torchrun``, 2 ranks, gloo, OMP_NUM_THREADS=1. Figures from rank 0, medians:

- ``profiler_overhead``: profiled step time / plain step time - 1, a profiled step being one the
  engine's ``flops_profiler`` makes (forward counted per module, then backward and step),
  alternating with plain steps; target <= 10%.
- ``comms_logger_overhead_enabled``: 1 - tokens/s with the logger enabled (every op recorded) /
  tokens/s with it disabled, blocks alternating in the same job; target <= 3%.
- ``comms_logger_disabled_share`` (dslaunch): what the disabled logger adds, from its parts: the
  one test per collective (ns, timed here) x collectives per step / step time; target 0.
- ``comms_logger_enabled_share`` (dslaunch): the same for the enabled logger (a device
  synchronise and a record per collective, us timed here): the cost itself, for when the step
  times of a shared machine vary more between blocks than the logger could change them.
- ``profile_counts``: (fwd FLOPs, MACs, params) each profiler reports for the same step, a
  cross-check of the counting (MACs should agree).

JSON to stdout and benchmarks/results/observability-<timestamp>.json; a table to stderr. The
machine may be shared: ``loadavg`` is recorded next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peer_scripts"))
sys.path.insert(0, str(HERE.parent))

import benchutil as bu  # noqa: E402

SCRIPT = bu.PEER_SCRIPTS / "observability_rank.py"


def run_env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["DSLAUNCH_ACCELERATOR"] = "cpu"
    env.pop("BENCH_ZERO_EXTRA", None)
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(k, None)
    return env


def one_job(impl: str, args, work: Path, peer_py: str | None) -> dict:
    out = work / impl
    out.mkdir(parents=True, exist_ok=True)
    script_args = ["--impl", impl, "--out", str(out), "--warmup", str(args.warmup),
                   "--steps", str(args.steps), "--blocks", str(args.blocks)]
    if args.smoke:
        script_args.append("--smoke")
    env = run_env()
    if impl == "dslaunch":
        launcher = bu.venv_bin("dslaunch")
        pre = [launcher] if launcher else [sys.executable, "-m", "dslaunch"]
        cmd = pre + ["run", "--nproc-per-node", "2", "--omp-threads", "1", str(SCRIPT)] + script_args
    else:
        env.pop("PYTHONPATH", None)  # the peer venv sees only DeepSpeed
        cmd = [str(Path(peer_py).parent / "torchrun"), "--standalone", "--nproc-per-node", "2",
               str(SCRIPT)] + script_args
    rc, wall = bu.run_logged(cmd, out / "launcher.log", env, args.timeout)
    if rc != 0:
        tail = (out / "launcher.log").read_text(errors="replace")[-2000:]
        return {"impl": impl, "status": f"failed (rc {rc})", "log_tail": tail}
    r = json.loads((out / "rank0.json").read_text())
    t = r["times"]
    med = {k: bu.median(v) for k, v in t.items()}
    tps = {k: r["tokens_per_step"] / med[k] for k in ("logger_on", "logger_off")}
    return {"impl": impl, "status": "ok", "version": r["version"], "wall_s": round(wall, 1),
            "median_step_s": {k: round(v, 5) for k, v in med.items()},
            "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
            "profiler_overhead": round(med["profiled"] / med["plain"] - 1, 4),
            "comms_logger_overhead_enabled": round(1 - tps["logger_on"] / tps["logger_off"], 4),
            "profile_counts": r["profile_counts"],
            "collectives_per_step": r["collectives_per_step"],
            "samples": {k: len(v) for k, v in t.items()}}


def disabled_check_ns() -> float:
    """ns of what the disabled logger adds to a collective: one attribute test."""
    from dslaunch.engine.observe.comms_logger import COMMS_LOGGER

    n = 2_000_000
    with_test = min(timeit.repeat("if L.enabled: pass", globals={"L": COMMS_LOGGER}, number=n,
                                  repeat=5))
    empty = min(timeit.repeat("pass", number=n, repeat=5))
    return max(with_test - empty, 0.0) / n * 1e9


def enabled_record_us() -> float:
    """us the enabled logger adds to one collective: the device synchronise and the record
    (``Comm._log``'s work), on a logger of its own."""
    from dslaunch.accelerator import get_accelerator
    from dslaunch.engine.observe.comms_logger import CommsLogger

    log = CommsLogger()
    log.configure({"enabled": True})
    sync = get_accelerator().synchronize
    sizes = [4 * (1 << (i % 12)) for i in range(64)]  # a few message sizes, as a step has

    def one_batch(n=20_000):
        for i in range(n):
            sync()
            log.record("all_reduce", sizes[i % 64], 1e-3, 2)

    best = min(timeit.repeat(one_batch, number=1, repeat=3))
    return best / 20_000 * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the tiny GPT")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="steps per mode per block")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    args = p.parse_args(argv)
    peer_py = None if args.no_peer else bu.peer_python(create=True)
    result = {"benchmark": "observability", "when": bu.now_iso(), "machine": bu.machine(),
              "git": bu.git_rev(), "loadavg_before": bu.loadavg(),
              "settings": {"smoke": args.smoke, "warmup": args.warmup, "steps": args.steps,
                           "blocks": args.blocks, "ranks": 2, "zero_stage": 2,
                           "backend": "gloo"},
              "targets": {"profiler_overhead": 0.10, "comms_logger_overhead_enabled": 0.03,
                          "comms_logger_disabled_share": 0.0}}
    with tempfile.TemporaryDirectory(prefix="bench_obs_") as tmp:
        runs = {"dslaunch": one_job("dslaunch", args, Path(tmp), None)}
        if peer_py is not None:
            runs["deepspeed"] = one_job("deepspeed", args, Path(tmp), peer_py)
        else:
            runs["deepspeed"] = {"status": "skipped (no peer venv)" if not args.no_peer else "skipped"}
    ours = runs["dslaunch"]
    if ours.get("status") == "ok" and ours.get("collectives_per_step"):
        ns = disabled_check_ns()
        share = ns * 1e-9 * ours["collectives_per_step"] / ours["median_step_s"]["logger_off"]
        ours["comms_logger_disabled_check_ns"] = round(ns, 2)
        ours["comms_logger_disabled_share"] = share
        us = enabled_record_us()
        ours["comms_logger_enabled_record_us"] = round(us, 3)
        ours["comms_logger_enabled_share"] = (us * 1e-6 * ours["collectives_per_step"]
                                              / ours["median_step_s"]["logger_off"])
    peer = runs["deepspeed"]
    if ours.get("status") == "ok" and peer.get("status") == "ok":
        result["ratios_dslaunch_over_deepspeed"] = {
            "tokens_per_s_logger_off": bu.ratio(ours["tokens_per_s"]["logger_off"],
                                                peer["tokens_per_s"]["logger_off"]),
            "tokens_per_s_logger_on": bu.ratio(ours["tokens_per_s"]["logger_on"],
                                               peer["tokens_per_s"]["logger_on"]),
            "profiled_step_time": bu.ratio(ours["median_step_s"]["profiled"],
                                           peer["median_step_s"]["profiled"]),
            "fwd_macs": bu.ratio(ours["profile_counts"][1], peer["profile_counts"][1]),
            "fwd_flops": bu.ratio(ours["profile_counts"][0], peer["profile_counts"][0])}
    result["runs"] = runs
    result["loadavg_after"] = bu.loadavg()
    path = bu.save_json(result, "observability", Path(args.results_dir))
    for name, r in runs.items():
        if r.get("status") != "ok":
            bu.log(f"{name:<10} {r.get('status')}")
            continue
        bu.log(f"{name:<10} profiler overhead {100 * r['profiler_overhead']:6.2f}%   comms logger "
               f"on {100 * r['comms_logger_overhead_enabled']:6.2f}%   tokens/s off "
               f"{r['tokens_per_s']['logger_off']:,.0f}   counts {r['profile_counts']}")
    if "comms_logger_disabled_share" in ours:
        bu.log(f"dslaunch disabled logger: {ours['comms_logger_disabled_check_ns']} ns per "
               f"collective, {100 * ours['comms_logger_disabled_share']:.5f}% of a step; enabled: "
               f"{ours['comms_logger_enabled_record_us']} us per collective, "
               f"{100 * ours['comms_logger_enabled_share']:.5f}% of a step")
    bu.log(f"loadavg {result['loadavg_before']} -> {result['loadavg_after']}; written {path}")
    print(json.dumps(result, indent=1))
    return 0 if ours.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
