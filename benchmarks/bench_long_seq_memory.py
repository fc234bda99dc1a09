"""Long-sequence memory: peak RSS per rank of the example GPT's training step against sequence
length, plain / activation checkpointing / tiling (tiled MLP + tiled logits and loss) / both, and
the longest sequence each trains within a fixed per-rank memory cap; dslaunch beside DeepSpeed
(its checkpointing and ALST tiled classes, which run on the CPU) in the same run.

    DSLAUNCH_PEER_VENV=... python benchmarks/bench_long_seq_memory.py [--base-seq 1024]
        [--max-seq 16384] [--cap-mb MB] [--sp 1] [--jobs 2]

Each measurement is one process (benchmarks/peer_scripts/long_seq_memory_rank.py: two training
steps through the library's own ``initialize`` with a torch AdamW, one rank, batch 1), whose peak
RSS (``ru_maxrss``) is the figure. glibc serves blocks of 128 KiB and more with mmap and gives
them back when freed (MALLOC_MMAP_THRESHOLD_=131072, for both libraries), so the peak follows
what is live rather than what the heap kept.

The cap: ``--cap-mb``, or the plain dslaunch run's peak at ``--base-seq``. For each library and
mode the lengths ``base * 2^k`` are run up to ``--max-seq``, stopping at the first one over the
cap (lengths up to ``--table-max-seq`` always run, for the peak-vs-length table); the longest
length within the cap is that mode's figure (a lower bound when it is ``--max-seq`` itself).

``--sp N`` (N > 1): sequence parallelism needs the Ulysses grid in the example, which is not in
this branch yet: those runs are reported as not run, with the reason.

JSON to benchmarks/results/long_seq_memory-<timestamp>.json. Run where the machine is shared: the
memory figures do not depend on load, the seconds per step do (say so next to them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))
import benchutil as bu

RANK_SCRIPT = bu.PEER_SCRIPTS / "long_seq_memory_rank.py"
MODES = ("plain", "ckpt", "tiled", "ckpt_tiled")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-seq", type=int, default=1024)
    p.add_argument("--max-seq", type=int, default=16384)
    p.add_argument("--table-max-seq", type=int, default=4096,
                   help="every mode runs up to this length (the peak-vs-length table)")
    p.add_argument("--cap-mb", type=float, default=None,
                   help="per-rank memory cap (default: plain dslaunch's peak at --base-seq)")
    p.add_argument("--sp", default="1", help="sequence-parallel sizes, comma-separated")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--rows-per-loss-tile", type=int, default=128)
    p.add_argument("--rows-per-mlp-tile", type=int, default=1024)
    p.add_argument("--jobs", type=int, default=2, help="measurements side by side (memory is "
                   "per process; the seconds per step suffer)")
    p.add_argument("--no-peer", action="store_true", help="dslaunch only")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--results", default=str(bu.RESULTS))
    return p.parse_args()


def measure(args, impl, python, mode, seq, workdir) -> dict:
    out = Path(workdir) / f"{impl}-{mode}-{seq}.json"
    cmd = [python, str(RANK_SCRIPT), "--impl", impl, "--mode", mode, "--seq", str(seq),
           "--vocab", str(args.vocab), "--d-model", str(args.d_model), "--n-layer",
           str(args.n_layer), "--n-head", str(args.n_head),
           "--loss-tiles", str(max(2, seq // args.rows_per_loss_tile)),
           "--mlp-tiles", str(max(2, seq // args.rows_per_mlp_tile)), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    env.pop("DSLAUNCH_AS_DEEPSPEED", None)
    if impl == "dslaunch":
        env["PYTHONPATH"] = os.pathsep.join([str(bu.REPO), env.get("PYTHONPATH", "")])
    else:  # the peer's own packages only
        env.pop("PYTHONPATH", None)
    rc, wall = bu.run_logged(cmd, out.with_suffix(".log"), env, args.timeout)
    row = {"impl": impl, "mode": mode, "seq": seq, "status": "ok" if rc == 0 else f"rc={rc}",
           "wall_s": round(wall, 1)}
    if rc == 0:
        got = json.loads(out.read_text())
        row.update(peak_rss_mb=round(got["peak_rss_bytes"] / 2 ** 20, 1),
                   rss_before_training_mb=round(got["rss_before_training"] / 2 ** 20, 1),
                   losses=got["losses"], step_seconds=[round(s, 2) for s in got["step_seconds"]],
                   params=got["params"], mlp_tiles=got["mlp_tiles"], loss_tiles=got["loss_tiles"],
                   version=got["version"])
    else:
        row["log_tail"] = out.with_suffix(".log").read_text(errors="replace")[-1500:]
    bu.log(f"{impl:9s} {mode:10s} seq {seq:6d}: {row.get('peak_rss_mb', row['status'])} MB "
           f"({row['wall_s']} s)")
    return row


def walk(args, impl, python, mode, cap_mb, workdir) -> list:
    """The lengths base * 2^k of one library and mode, until one is over the cap (past the
    table's lengths) or --max-seq."""
    rows, seq = [], args.base_seq
    while seq <= args.max_seq:
        row = measure(args, impl, python, mode, seq, workdir)
        rows.append(row)
        over = row["status"] != "ok" or row["peak_rss_mb"] > cap_mb
        if over and seq >= args.table_max_seq:
            break
        seq *= 2
    return rows


def longest(rows, cap_mb):
    fits = [r["seq"] for r in rows if r["status"] == "ok" and r["peak_rss_mb"] <= cap_mb]
    return max(fits) if fits else None


def main():
    args = parse()
    sps = [int(s) for s in bu.split(args.sp)]
    impls = {"dslaunch": sys.executable}
    peer = None if args.no_peer else bu.peer_python(create=True)
    if peer:
        impls["deepspeed"] = peer
    shown_args = dict(vars(args), results=os.path.relpath(args.results, bu.REPO))  # no host path
    result = {"bench": "long_seq_memory", "when": bu.now_iso(), "machine": bu.machine(),
              "loadavg_start": bu.loadavg(), "git": bu.git_rev(), "args": shown_args,
              "model": {"vocab": args.vocab, "d_model": args.d_model, "n_layer": args.n_layer,
                        "n_head": args.n_head, "batch": 1},
              "versions": {"torch": bu.pkg_version("torch"),
                           "deepspeed": bu.pkg_version("deepspeed", peer) if peer else None},
              "peer": ("DeepSpeed in its venv: deepspeed.initialize, deepspeed.checkpointing."
                       "checkpoint, ulysses_sp.TiledMLP / TiledFusedLogitsLoss (all run on the "
                       "CPU here)") if peer else "not available (no peer venv)",
              "note": ("the machine is shared with other jobs: peak RSS does not depend on load, "
                       "step_seconds do"),
              "sp": {}}
    with tempfile.TemporaryDirectory(prefix="long_seq_memory-") as workdir:
        for sp in sps:
            if sp != 1:
                result["sp"][str(sp)] = {"status": "not run: sequence parallelism in the example "
                                         "(the Ulysses grid, --sp) is not in this branch yet"}
                continue
            cap_row = measure(args, "dslaunch", sys.executable, "plain", args.base_seq, workdir)
            cap_mb = args.cap_mb or cap_row.get("peak_rss_mb")
            if cap_mb is None:
                raise SystemExit(f"the plain run at {args.base_seq} failed:\n"
                                 f"{cap_row.get('log_tail', '')}")
            chains = [(impl, py, mode) for impl, py in impls.items() for mode in MODES]
            with ThreadPoolExecutor(max(1, args.jobs)) as pool:
                walks = list(pool.map(walk, *zip(*[(args, impl, py, mode, cap_mb, workdir)
                                                    for impl, py, mode in chains])))
            rows = [r for w in walks for r in w]
            summary = {}
            for (impl, _, mode), w in zip(chains, walks):
                summary.setdefault(impl, {})[mode] = {
                    "longest_seq_within_cap": longest(w, cap_mb),
                    "lower_bound": longest(w, cap_mb) == args.max_seq,
                    "peak_rss_mb_by_seq": {r["seq"]: r.get("peak_rss_mb") for r in w}}
            for modes in summary.values():
                plain = modes["plain"]["longest_seq_within_cap"]
                both = modes["ckpt_tiled"]["longest_seq_within_cap"]
                modes["longest_ratio_ckpt_tiled_vs_plain"] = bu.ratio(both, plain)
            vs_peer = {}
            if "deepspeed" in summary:
                for mode in MODES:
                    ours, theirs = summary["dslaunch"][mode], summary["deepspeed"][mode]
                    vs_peer[mode] = {
                        "peak_rss_ratio_by_seq (dslaunch/deepspeed)": {
                            seq: bu.ratio(mb, theirs["peak_rss_mb_by_seq"].get(seq))
                            for seq, mb in ours["peak_rss_mb_by_seq"].items()
                            if theirs["peak_rss_mb_by_seq"].get(seq)},
                        "longest_ratio (dslaunch/deepspeed)": bu.ratio(
                            ours["longest_seq_within_cap"], theirs["longest_seq_within_cap"])}
            first_losses = {f"{r['impl']}/{r['mode']}/{r['seq']}": r["losses"] for r in rows
                            if r["status"] == "ok"}
            result["sp"]["1"] = {"cap_mb": cap_mb, "cap_from": "--cap-mb" if args.cap_mb else
                                 f"plain dslaunch peak at seq {args.base_seq}",
                                 "runs": [cap_row] + rows, "summary": summary,
                                 "vs_deepspeed": vs_peer, "losses": first_losses}
    result["loadavg_end"] = bu.loadavg()
    path = bu.save_json(result, "long_seq_memory", Path(args.results))
    print(json.dumps({k: result["sp"][k].get("summary", result["sp"][k]) for k in result["sp"]},
                     indent=1))
    if "1" in result["sp"]:
        print(json.dumps(result["sp"]["1"]["vs_deepspeed"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
