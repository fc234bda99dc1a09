"""Long-sequence memory: peak RSS per rank of the example GPT's training step against sequence
length, plain / activation checkpointing / tiling (tiled MLP + tiled logits and loss) / both, at
sequence-parallel (Ulysses) sizes 1, 2, 4, and the longest sequence each trains within a fixed
per-rank memory cap; dslaunch beside DeepSpeed (its checkpointing, ALST tiled classes and
DistributedAttention, which run on the CPU with gloo) in the same run.

    DSLAUNCH_PEER_VENV=... python benchmarks/bench_long_seq_memory.py [--base-seq 1024]
        [--max-seq 16384] [--table-max-seq 4096] [--cap-mb MB] [--sp 1,2] [--modes ...]
        [--jobs 2]

Each measurement is one job (benchmarks/peer_scripts/long_seq_memory_rank.py: two training steps
through the library's own ``initialize`` with a torch AdamW, batch 1); each rank's peak RSS
(``ru_maxrss``) is its figure, the largest rank's is the row's. glibc serves blocks of 128 KiB and
more with mmap and gives them back when freed (MALLOC_MMAP_THRESHOLD_=131072, for both
libraries), so the peak follows what is live rather than what the heap kept. Activation memory
of a rank = its peak RSS minus its RSS just before the first step (so it also holds the gradients
and AdamW state, 3 x 4 bytes a parameter, the same at every SP size); ``activation_over_state``
= peak minus the RSS after the first step (those states then resident), the activations alone.

SP 1: one process. The cap: ``--cap-mb``, or the plain dslaunch run's peak at ``--base-seq``.
For each library and mode the lengths ``base * 2^k`` are run up to ``--max-seq``, stopping at the
first one over the cap (lengths up to ``--table-max-seq`` always run, for the peak-vs-length
table); the longest length within the cap is that mode's figure (a lower bound when it is
``--max-seq`` itself).

SP N > 1: N ranks share each sample, launched by ``dslaunch run --nproc-per-node N`` (DeepSpeed:
its venv's ``torchrun``), each holding ``seq / N`` tokens, attention through the library's
``DistributedAttention`` over its sequence grid, as examples/train_gpt.py ``--sp N`` runs it. The
table's lengths (``--base-seq`` .. ``--table-max-seq``) run for every mode; with SP 1 in the same
run, ``sp_vs_sp1`` gives each length's activation memory (and peak) at SP N over SP 1's, and the
largest loss difference (the same samples: the losses must agree).

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
    p.add_argument("--sp", default="1", help="sequence-parallel sizes, comma-separated (SP > 1: "
                   "the lengths up to --table-max-seq, against SP 1's when it is in the list)")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {', '.join(MODES)}")
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
    args = p.parse_args()
    args.mode_list = bu.split(args.modes)
    for mode in args.mode_list:
        if mode not in MODES:
            p.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    return args


def measure(args, impl, python, mode, seq, workdir, sp=1) -> dict:
    out = Path(workdir) / f"{impl}-{mode}-{seq}-sp{sp}.json"
    local = seq // sp  # each rank's rows
    cmd = [str(RANK_SCRIPT), "--impl", impl, "--mode", mode, "--seq", str(seq), "--sp", str(sp),
           "--vocab", str(args.vocab), "--d-model", str(args.d_model), "--n-layer",
           str(args.n_layer), "--n-head", str(args.n_head),
           "--loss-tiles", str(max(2, local // args.rows_per_loss_tile)),
           "--mlp-tiles", str(max(2, local // args.rows_per_mlp_tile)), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    env.pop("DSLAUNCH_AS_DEEPSPEED", None)
    if impl == "dslaunch":
        env["PYTHONPATH"] = os.pathsep.join([str(bu.REPO), env.get("PYTHONPATH", "")])
        launch = [python] if sp == 1 else [python, "-m", "dslaunch", "run", "--nproc-per-node",
                                           str(sp), "--omp-threads", "1"]
    else:  # the peer's own packages only, its own launcher
        env.pop("PYTHONPATH", None)
        launch = [python] if sp == 1 else [str(Path(python).parent / "torchrun"), "--standalone",
                                           "--nproc-per-node", str(sp)]
    rc, wall = bu.run_logged(launch + cmd, out.with_suffix(".log"), env, args.timeout)
    row = {"impl": impl, "mode": mode, "seq": seq, "sp": sp,
           "status": "ok" if rc == 0 else f"rc={rc}", "wall_s": round(wall, 1)}
    if rc == 0:
        got = json.loads(out.read_text())
        ranks = got["ranks"]
        mb = [{"peak_rss_mb": round(r["peak_rss_bytes"] / 2 ** 20, 1),
               "rss_before_training_mb": round(r["rss_before_training"] / 2 ** 20, 1),
               "rss_after_first_step_mb": round(r["rss_after_first_step"] / 2 ** 20, 1)}
              for r in ranks]
        row.update(peak_rss_mb=max(r["peak_rss_mb"] for r in mb),  # the largest rank's
                   rss_before_training_mb=max(r["rss_before_training_mb"] for r in mb),
                   activation_mb=round(max(r["peak_rss_mb"] - r["rss_before_training_mb"]
                                           for r in mb), 1),
                   # less the gradients and optimizer state (resident after the first step)
                   activation_over_state_mb=round(max(r["peak_rss_mb"] - r["rss_after_first_step_mb"]
                                                      for r in mb), 1),
                   per_rank=mb, losses=got["losses"], local_seq=got["local_seq"],
                   step_seconds=[round(s, 2) for s in ranks[0]["step_seconds"]],
                   params=got["params"], mlp_tiles=got["mlp_tiles"], loss_tiles=got["loss_tiles"],
                   version=got["version"])
    else:
        row["log_tail"] = out.with_suffix(".log").read_text(errors="replace")[-1500:]
    bu.log(f"{impl:9s} {mode:10s} seq {seq:6d} sp {sp}: {row.get('peak_rss_mb', row['status'])}"
           f" MB peak, {row.get('activation_mb')} MB activations ({row['wall_s']} s)")
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


def run_sp1(args, impls, workdir) -> dict:
    """SP 1, one rank: the peak-vs-length table and the longest length within the cap."""
    cap_row = measure(args, "dslaunch", sys.executable, "plain", args.base_seq, workdir)
    cap_mb = args.cap_mb or cap_row.get("peak_rss_mb")
    if cap_mb is None:
        raise SystemExit(f"the plain run at {args.base_seq} failed:\n"
                         f"{cap_row.get('log_tail', '')}")
    chains = [(impl, py, mode) for impl, py in impls.items() for mode in args.mode_list]
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
        if "plain" in modes and "ckpt_tiled" in modes:
            modes["longest_ratio_ckpt_tiled_vs_plain"] = bu.ratio(
                modes["ckpt_tiled"]["longest_seq_within_cap"],
                modes["plain"]["longest_seq_within_cap"])
    vs_peer = {}
    if "deepspeed" in summary:
        for mode in args.mode_list:
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
    return {"cap_mb": cap_mb, "cap_from": "--cap-mb" if args.cap_mb else
            f"plain dslaunch peak at seq {args.base_seq}",
            "runs": [cap_row] + rows, "summary": summary, "vs_deepspeed": vs_peer,
            "losses": first_losses}


def table_seqs(args) -> list:
    seqs, seq = [], args.base_seq
    while seq <= min(args.table_max_seq, args.max_seq):
        seqs.append(seq)
        seq *= 2
    return seqs


def run_sp(args, impls, sp, workdir) -> dict:
    """SP > 1, ``sp`` ranks sharing each sample: every mode at the table's lengths."""
    jobs = [(args, impl, py, mode, seq, workdir, sp) for impl, py in impls.items()
            for mode in args.mode_list for seq in table_seqs(args) if seq % sp == 0]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(measure, *zip(*jobs)))
    summary = {}
    for r in rows:
        summary.setdefault(r["impl"], {}).setdefault(r["mode"], {})[r["seq"]] = {
            "peak_rss_mb": r.get("peak_rss_mb"), "activation_mb": r.get("activation_mb")}
    return {"ranks": sp, "runs": rows, "summary": summary}


def versus_sp1(sp1_rows, rows) -> dict:
    """Per library, mode and length: the largest rank's activation memory (peak RSS minus its
    RSS before training) and peak at SP N over SP 1's, and the losses' largest difference."""
    base = {(r["impl"], r["mode"], r["seq"]): r for r in sp1_rows if r["status"] == "ok"}
    out = {}
    for r in rows:
        one = base.get((r["impl"], r["mode"], r["seq"]))
        if r["status"] != "ok" or one is None:
            continue
        out.setdefault(r["impl"], {}).setdefault(r["mode"], {})[r["seq"]] = {
            "activation_mb": [one["activation_mb"], r["activation_mb"]],
            "activation_ratio": bu.ratio(r["activation_mb"], one["activation_mb"]),
            "activation_over_state_mb": [one["activation_over_state_mb"],
                                         r["activation_over_state_mb"]],
            "activation_over_state_ratio": bu.ratio(r["activation_over_state_mb"],
                                                    one["activation_over_state_mb"]),
            "peak_rss_mb": [one["peak_rss_mb"], r["peak_rss_mb"]],
            "peak_ratio": bu.ratio(r["peak_rss_mb"], one["peak_rss_mb"]),
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(one["losses"], r["losses"]))}
    return out


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
            result["sp"][str(sp)] = (run_sp1(args, impls, workdir) if sp == 1 else
                                     run_sp(args, impls, sp, workdir))
        if "1" in result["sp"]:
            result["sp_vs_sp1"] = {str(sp): versus_sp1(result["sp"]["1"]["runs"],
                                                       result["sp"][str(sp)]["runs"])
                                   for sp in sps if sp != 1}
    result["loadavg_end"] = bu.loadavg()
    path = bu.save_json(result, "long_seq_memory", Path(args.results))
    print(json.dumps({k: result["sp"][k].get("summary", result["sp"][k]) for k in result["sp"]},
                     indent=1))
    if "1" in result["sp"]:
        print(json.dumps(result["sp"]["1"]["vs_deepspeed"], indent=1))
    if result.get("sp_vs_sp1"):
        print(json.dumps(result["sp_vs_sp1"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
