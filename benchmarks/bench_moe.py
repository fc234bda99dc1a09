"""Mixture of experts: dslaunch.moe vs DeepSpeed 0.19.8's MoE, side by side in one run.

Both train examples/moe_gpt.py's model (the example GPT, an MoE MLP in every other block; top-1,
4 experts, no random token selection) on the same data with configs/moe_gpt_zero1.json (ZeRO 1,
fp32, AdamW), on CPU with gloo, OMP_NUM_THREADS=1 for every launcher:

  dslaunch   dslaunch run ... examples/train_moe_gpt.py --json ...
  deepspeed  <peer venv>/torchrun --standalone ... peer_scripts/deepspeed_moe_train.py --json ...
             (the peer venv: benchmarks/peers.py, DSLAUNCH_PEER_VENV)

Per (ranks, ep) in 2 ranks x EP 1, 2 and 4 ranks x EP 1, 2, 4 (capacity factor 1.0, token
dropping on): tokens/s after the warm-up steps, all-to-all payload bytes per step on rank 0
(dslaunch: engine.comm_stats(); DeepSpeed: a counting wrapper of deepspeed.comm's
all_to_all_single), the peak RSS of the largest rank, the per-step losses; ratios dslaunch /
DeepSpeed (medians over ``--repeats``, runs alternated). Checks written beside: each runtime's EP
> 1 losses against its EP 1 run at the same ranks (largest relative difference), and dslaunch's
losses against DeepSpeed's at the same configuration. Then dslaunch alone, dropless
(``drop_tokens=False``: the ragged all-to-all, exactly the routed tokens) vs capacity factor 1.25
at ``--drop-ranks`` ranks and EP ``--drop-ep``, and beside them dropless with every expert's
buffer padded to the busiest expert's count (``--padded-dropless``, DeepSpeed's way), the three
alternated per repeat (each first in turn): tokens/s, CPU time per step (its largest rank:
less sensitive than tokens/s to other jobs on a shared machine), the all-to-all bytes and the
fraction of token assignments dropped. ``--layouts ''`` (with ``--no-peer``) runs that comparison alone.

    DSLAUNCH_PEER_VENV=... python benchmarks/bench_moe.py [--steps 30] [--repeats 1]
        [--out benchmarks/results/moe-<timestamp>.json]

The machine may be shared: the load average before and after is in the JSON.
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

CONFIG = bu.REPO / "configs" / "moe_gpt_zero1.json"
EXAMPLE = bu.REPO / "examples" / "train_moe_gpt.py"
PEER = bu.PEER_SCRIPTS / "deepspeed_moe_train.py"
LAYOUTS = [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]  # (ranks, ep)
DROP_VARIANTS = (("capacity_1.25", ("--capacity-factor", 1.25)), ("dropless", ("--dropless",)),
                 ("dropless_padded", ("--dropless", "--padded-dropless")))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of tokens/s")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--layouts", default=",".join(f"{n}x{e}" for n, e in LAYOUTS),
                   help="RANKSxEP, comma-separated")
    p.add_argument("--drop-ranks", type=int, default=2)
    p.add_argument("--drop-ep", type=int, default=2)
    p.add_argument("--model", default="--n-layer 4 --d-model 128 --n-head 4 --seq-len 64",
                   help="model options given to both runtimes")
    p.add_argument("--no-peer", action="store_true", help="dslaunch only")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/moe-*.json)")
    return p.parse_args(argv)


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        e.pop(k, None)
    return e


def command(runtime, ranks, ep, args, out, peer_py, extra=()) -> list:
    common = ["--experts", args.experts, "--ep", ep, "--top-k", 1, "--steps", args.steps,
              "--warmup", args.warmup, *bu.split(args.model.replace(" ", ",")), *extra,
              "--json", out]
    if runtime == "dslaunch":
        launcher = bu.venv_bin("dslaunch")
        pre = [launcher] if launcher else [sys.executable, "-m", "dslaunch"]
        return [*pre, "run", "--nproc-per-node", ranks, "--omp-threads", "1", str(EXAMPLE),
                "--config", str(CONFIG), "--log-every", 1000, *common]
    torchrun = str(Path(peer_py).parent / "torchrun")
    return [torchrun, "--standalone", "--nproc-per-node", ranks, str(PEER), "--config",
            str(CONFIG), *common]


def one_run(runtime, ranks, ep, args, work: Path, tag: str, peer_py, extra=()) -> dict:
    out = work / f"{tag}.json"
    cmd = [str(c) for c in command(runtime, ranks, ep, args, out, peer_py, extra)]
    rc, wall = bu.run_logged(cmd, work / f"{tag}.log", env(), args.timeout)
    run = {"runtime": runtime, "ranks": ranks, "ep": ep, "command": shlex.join(cmd),
           "returncode": rc, "wall_seconds": round(wall, 2)}
    if rc != 0 or not out.exists():
        run["status"] = "failed"
        run["log_tail"] = (work / f"{tag}.log").read_text()[-3000:]
        bu.log(f"  {tag}: FAILED ({rc})")
        return run
    res = json.loads(out.read_text())
    run.update(status="ok", tokens_per_s=round(res["tokens_per_s"], 1),
               all_to_all_bytes_per_step=res["all_to_all_bytes_per_step"],
               peak_rss_mb_max=round(max(res["peak_rss_bytes"]) / 2**20, 1),
               peak_rss_mb_per_rank=[round(b / 2**20, 1) for b in res["peak_rss_bytes"]],
               losses=[s["loss"] for s in res["steps"]],
               aux_loss_last=res["steps"][-1]["aux_loss"],
               cpu_ms_per_step_per_rank=[round(c * 1000, 2)
                                         for c in res.get("cpu_seconds_per_step") or []],
               dropped_mean=sum(s["dropped"] for s in res["steps"]) / len(res["steps"]))
    bu.log(f"  {tag}: {run['tokens_per_s']} tokens/s, a2a {run['all_to_all_bytes_per_step']:.0f}"
           f" B/step, peak RSS {run['peak_rss_mb_max']} MB")
    return run


def portable(result: dict, peer_py, tmp: str) -> dict:
    """The result without this machine's paths: the repository's own relative, the peer venv as
    ``<peer-venv>``, this interpreter's venv as ``<venv>``, the scratch directory as ``<tmp>``."""
    text = json.dumps(result)
    subs = [(str(bu.REPO) + "/", ""), (tmp, "<tmp>"), (str(Path(sys.executable).parent), "<venv>/bin")]
    if peer_py:
        subs.append((str(Path(peer_py).parent.parent), "<peer-venv>"))
    for old, new in subs:
        text = text.replace(old, new)
    return json.loads(text)


def rel_diff(a, b):
    n = min(len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n])) if n else None


def summarise(runs: list, layouts: list, runtimes: list) -> list:
    rows = []
    for ranks, ep in layouts:
        row = {"ranks": ranks, "ep": ep}
        for rt in runtimes:
            ok = [r for r in runs if r["runtime"] == rt and r["ranks"] == ranks and r["ep"] == ep
                  and r["status"] == "ok"]
            if not ok:
                row[rt] = None
                continue
            base = [r for r in runs if r["runtime"] == rt and r["ranks"] == ranks and r["ep"] == 1
                    and r["status"] == "ok"]
            row[rt] = {"tokens_per_s": bu.median([r["tokens_per_s"] for r in ok]),
                       "all_to_all_bytes_per_step": ok[0]["all_to_all_bytes_per_step"],
                       "peak_rss_mb_max": bu.median([r["peak_rss_mb_max"] for r in ok]),
                       "loss_last": ok[0]["losses"][-1],
                       "loss_rel_diff_vs_ep1": rel_diff(ok[0]["losses"], base[0]["losses"])
                       if base else None}
        d, p = row.get("dslaunch"), row.get("deepspeed")
        if d and p:
            row["ratio_tokens_per_s"] = bu.ratio(d["tokens_per_s"], p["tokens_per_s"])
            row["ratio_peak_rss"] = bu.ratio(d["peak_rss_mb_max"], p["peak_rss_mb_max"])
            row["loss_rel_diff_dslaunch_vs_deepspeed"] = rel_diff(
                [r for r in runs if r["runtime"] == "dslaunch" and r["ranks"] == ranks
                 and r["ep"] == ep and r["status"] == "ok"][0]["losses"],
                [r for r in runs if r["runtime"] == "deepspeed" and r["ranks"] == ranks
                 and r["ep"] == ep and r["status"] == "ok"][0]["losses"])
        rows.append(row)
    return rows


def main(argv=None):
    args = parse_args(argv)
    layouts = [tuple(int(x) for x in item.split("x")) for item in bu.split(args.layouts)]
    peer_py = None if args.no_peer else bu.peer_python(create=True)
    runtimes = ["dslaunch"] + (["deepspeed"] if peer_py else [])
    if not args.no_peer and peer_py is None:
        bu.log("DeepSpeed peer venv unavailable: dslaunch only")
    result = {"benchmark": "moe", "started": bu.now_iso(), "machine": bu.machine(),
              "loadavg_before": bu.loadavg(), "git": bu.git_rev(),
              "versions": {"torch": bu.pkg_version("torch"),
                           "deepspeed": bu.pkg_version("deepspeed", peer_py) if peer_py else None},
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "config": json.loads(CONFIG.read_text()),
              "note": "CPU, gloo, OMP_NUM_THREADS=1; the machine may be shared with other jobs "
                      "(loadavg), so tokens/s carry that noise",
              "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench_moe_") as tmp:
        work = Path(tmp)
        for rep in range(args.repeats):
            for ranks, ep in layouts:
                for rt in runtimes:
                    tag = f"{rt}_n{ranks}_ep{ep}_r{rep}"
                    result["runs"].append(one_run(rt, ranks, ep, args, work, tag, peer_py))
        drop = []
        for rep in range(args.repeats):
            turn = rep % len(DROP_VARIANTS)  # each variant first in turn: no order bias
            for name, extra in DROP_VARIANTS[turn:] + DROP_VARIANTS[:turn]:
                tag = f"dslaunch_{name}_r{rep}"
                run = one_run("dslaunch", args.drop_ranks, args.drop_ep, args, work, tag, None,
                              extra)
                run["variant"], run["repeat"] = name, rep
                drop.append(run)
    result["table"] = summarise(result["runs"], layouts, runtimes)
    ok = {v: [r for r in drop if r["variant"] == v and r["status"] == "ok"]
          for v, _ in DROP_VARIANTS}
    result["dropless_vs_capacity"] = {
        "ranks": args.drop_ranks, "ep": args.drop_ep, "runs": drop,
        **{f"{v}_tokens_per_s": bu.median([r["tokens_per_s"] for r in rs]) for v, rs in ok.items()},
        **{f"{v}_dropped_mean": rs[0]["dropped_mean"] if rs else None for v, rs in ok.items()},
        **{f"{v}_all_to_all_bytes_per_step": rs[0]["all_to_all_bytes_per_step"] if rs else None
           for v, rs in ok.items()}}
    dd = result["dropless_vs_capacity"]
    dd["ratio_dropless_over_capacity"] = bu.ratio(dd["dropless_tokens_per_s"],
                                                  dd["capacity_1.25_tokens_per_s"])
    dd["ratio_dropless_padded_over_capacity"] = bu.ratio(dd["dropless_padded_tokens_per_s"],
                                                         dd["capacity_1.25_tokens_per_s"])
    # CPU time per step (largest rank): the work a variant does, less sensitive to other jobs
    # on a shared machine than tokens/s; ratio as tokens/s's (> 1: dropless cheaper)
    for v, rs in ok.items():
        dd[f"{v}_cpu_ms_per_step_max"] = bu.median(
            [max(r["cpu_ms_per_step_per_rank"]) for r in rs if r["cpu_ms_per_step_per_rank"]])
    dd["ratio_dropless_over_capacity_by_cpu"] = bu.ratio(dd["capacity_1.25_cpu_ms_per_step_max"],
                                                         dd["dropless_cpu_ms_per_step_max"])
    dd["ratio_dropless_padded_over_capacity_by_cpu"] = bu.ratio(
        dd["capacity_1.25_cpu_ms_per_step_max"], dd["dropless_padded_cpu_ms_per_step_max"])
    # the same ratios per repeat (each repeat runs the variants back to back; a repeat with a
    # failed run is left out)
    pairs = [(c, d) for c in ok["capacity_1.25"] for d in ok["dropless"]
             if c["repeat"] == d["repeat"]]
    dd["ratio_dropless_over_capacity_per_repeat"] = [
        bu.ratio(d["tokens_per_s"], c["tokens_per_s"]) for c, d in pairs]
    dd["ratio_dropless_over_capacity_by_cpu_per_repeat"] = [
        bu.ratio(max(c["cpu_ms_per_step_per_rank"]), max(d["cpu_ms_per_step_per_rank"]))
        for c, d in pairs if c["cpu_ms_per_step_per_rank"] and d["cpu_ms_per_step_per_rank"]]
    result["loadavg_after"] = bu.loadavg()
    result = portable(result, peer_py, tmp)
    out = Path(args.out) if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    else:
        out = bu.save_json(result, "moe", bu.RESULTS)
    bu.log(f"{'ranks':>5} {'ep':>3} {'dslaunch tok/s':>15} {'deepspeed tok/s':>16} {'ratio':>6} "
           f"{'a2a B/step':>11} {'RSS MB d/p':>14} {'loss diff':>10}")
    for row in result["table"]:
        d, p = row.get("dslaunch") or {}, row.get("deepspeed") or {}
        bu.log(f"{row['ranks']:>5} {row['ep']:>3} {d.get('tokens_per_s')!s:>15} "
               f"{p.get('tokens_per_s')!s:>16} {row.get('ratio_tokens_per_s')!s:>6} "
               f"{d.get('all_to_all_bytes_per_step')!s:>11} "
               f"{d.get('peak_rss_mb_max')!s:>6}/{p.get('peak_rss_mb_max')!s:<7} "
               f"{row.get('loss_rel_diff_dslaunch_vs_deepspeed')!s:>10}")
    bu.log(f"dropless {dd['dropless_tokens_per_s']} tokens/s (dropped {dd['dropless_dropped_mean']})"
           f" vs capacity 1.25 {dd['capacity_1.25_tokens_per_s']} (dropped "
           f"{dd['capacity_1.25_dropped_mean']}): ratio {dd['ratio_dropless_over_capacity']} "
           f"(per repeat {dd['ratio_dropless_over_capacity_per_repeat']}); padded dropless "
           f"{dd['dropless_padded_tokens_per_s']}: ratio "
           f"{dd['ratio_dropless_padded_over_capacity']}; by CPU time per step: dropless "
           f"{dd['ratio_dropless_over_capacity_by_cpu']}, padded "
           f"{dd['ratio_dropless_padded_over_capacity_by_cpu']}")
    bu.log(f"wrote {out}")


if __name__ == "__main__":
    main()
