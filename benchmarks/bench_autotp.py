"""AutoTP training: dslaunch vs DeepSpeed 0.19.8's AutoTP (the peer venv, benchmarks/peers.py) on
the same Hugging Face Llama, data and config (``tensor_parallel.autotp_size``, torch's AdamW on
both sides, gloo on CPU).

    .venv/bin/python benchmarks/bench_autotp.py [--tp 2] [--stage 1] [--steps 3] [--rounds 1]
        [--vocab-parallel] [--out benchmarks/results/autotp-<time>.json]

``--vocab-parallel``: both engines with ``tensor_parallel.vocab_parallel_lm_head: true`` (the
untied LM head split by vocabulary, the loss over the split logits); without it (the default
configuration) both split the untied head by vocabulary and all-gather its logits (DeepSpeed
0.19.8's training default; dslaunch's since issue 33's fix, whole on every rank before).

* ``tiny`` (hidden 64, 2 layers, 4 heads / 2 key-value heads, 5 steps): the losses of the two,
  side by side, and their largest relative difference.
* ``small`` (hidden 512, 4 layers, 8 / 4 heads, vocabulary 8192, seq 256, micro 4 x
  accumulation 2): median seconds per step after one warm-up step, tokens/s of the job (a TP
  group's tokens counted once) and the largest peak RSS of a rank; the engines alternate per
  round. Ratios: dslaunch tokens/s / DeepSpeed's (above 1: dslaunch faster), peak RSS dslaunch /
  DeepSpeed (below 1: dslaunch leaner), each round's and their medians; rank 0's CPU seconds
  per step (process time, all threads: the work done, less sensitive to the host's load than
  the wall clock), dslaunch / DeepSpeed per round. The machine's load
  average is recorded before each round (CPU time is shared: the per-round ratios show the
  noise).

Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RANK = HERE / "peer_scripts" / "autotp_rank.py"
VENV_BIN = Path(sys.executable).parent


def _run(engine: str, size: str, args) -> dict:
    common = [str(RANK), "--engine", engine, "--size", size, "--tp", str(args.tp), "--stage",
              str(args.stage)] + (["--vocab-parallel"] if args.vocab_parallel else [])
    common += ["--steps", "5"] if size == "tiny" else ["--steps", str(args.steps), "--warmup", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if engine == "deepspeed":
        from peers import peer_python

        py = Path(peer_python(create=True))
        cmd = [str(py.parent / "torchrun"), "--nproc-per-node", str(args.tp), *common]
    else:
        cmd = [str(VENV_BIN / "dslaunch"), "run", "--nproc-per-node", str(args.tp),
               "--omp-threads", "1", *common]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in (proc.stdout + proc.stderr).splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{engine} {size} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--vocab-parallel", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    tiny = {e: _run(e, "tiny", args) for e in ("dslaunch", "deepspeed")}
    rel = max(abs(a - b) / abs(b) for a, b in zip(tiny["dslaunch"]["losses"],
                                                  tiny["deepspeed"]["losses"], strict=True))
    rounds = {"dslaunch": [], "deepspeed": []}
    load_each_round = []
    for r in range(args.rounds):
        load_each_round.append(os.getloadavg()[0])
        for e in (("dslaunch", "deepspeed") if r % 2 == 0 else ("deepspeed", "dslaunch")):
            rounds[e].append(_run(e, "small", args))
    small = {e: {"median_step_s": statistics.median(x["median_step_s"] for x in runs),
                 "cpu_s_per_step_rank0_each_round": [x["cpu_s_per_step_rank0"] for x in runs],
                 "tokens_per_s_each_round": [x["tokens_per_s"] for x in runs],
                 "peak_rss_bytes_each_round": [x["peak_rss_bytes_max_rank"] for x in runs],
                 "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs),
                 "peak_rss_bytes_max_rank": max(x["peak_rss_bytes_max_rank"] for x in runs),
                 "peak_rss_bytes_each_rank_each_round": [x["peak_rss_bytes_each_rank"]
                                                         for x in runs],
                 "q_proj_local_shape": runs[0]["q_proj_local_shape"],
                 "lm_head_local_shape": runs[0]["lm_head_local_shape"],
                 "losses": runs[0]["losses"]} for e, runs in rounds.items()}
    def per_round(key):  # dslaunch / DeepSpeed of one figure, round by round
        return [a[key] / b[key] for a, b in zip(rounds["dslaunch"], rounds["deepspeed"],
                                                 strict=True)]

    tokens, rss = per_round("tokens_per_s"), per_round("peak_rss_bytes_max_rank")
    doc = {"bench": "autotp", "tp": args.tp, "stage": args.stage, "rounds": args.rounds,
           "vocab_parallel_lm_head": args.vocab_parallel,
           "cpu_count": os.cpu_count(), "load_avg_before": load_before,
           "load_avg_after": os.getloadavg(), "load_avg_1min_each_round": load_each_round,
           "tiny_losses": {e: v["losses"] for e, v in tiny.items()},
           "tiny_max_rel_loss_diff": rel, "small": small,
           "ratio_tokens_per_s": small["dslaunch"]["tokens_per_s"]
           / small["deepspeed"]["tokens_per_s"],
           "ratio_tokens_per_s_each_round": tokens,
           "ratio_tokens_per_s_median_of_rounds": statistics.median(tokens),
           "ratio_cpu_s_per_step_each_round": per_round("cpu_s_per_step_rank0"),
           "ratio_peak_rss": small["dslaunch"]["peak_rss_bytes_max_rank"]
           / small["deepspeed"]["peak_rss_bytes_max_rank"],
           "ratio_peak_rss_each_round": rss,
           "ratio_peak_rss_median_of_rounds": statistics.median(rss)}
    text = json.dumps(doc, indent=1)
    print(text)
    out = Path(args.out or HERE / "results" / f"autotp-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
