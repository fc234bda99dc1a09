#!/usr/bin/env python
"""Training stall per checkpoint save: ``save_checkpoint(async_save=True)`` vs a synchronous save.

A GPT of about 200M parameters (examples/gpt.py: 16 layers, d_model 1024, vocab 8192, fp32,
AdamW, ZeRO stage 2) trains on CPU through ``dslaunch run`` (2 ranks by default, seq 32, micro
1). Each rank times its steps: a few plain steps give the baseline step time; then per save:
the ``save_checkpoint`` call, the following steps (an async save writes while they run, so any
slowdown is counted) and the wait for the write to complete (``wait_checkpoint``, at the point
where the next save would start). The stall of one save is

    save call + wait + sum over the following steps of (step time - baseline)

(for a synchronous save the two last terms are about 0; a negative slowdown counts as 0), and
``blocked`` is the save call + wait alone (the time the training loop cannot run). On a busy
machine the step-time term is noisy (other processes), so both are reported. Rank 0 writes the
checkpoint's model file and its own shard, the largest share, so its numbers are reported.
``ratio``: the median async stall over the median sync stall (target <= 0.2); ``ratio_blocked``
the same for ``blocked``.

    .venv/bin/python benchmarks/bench_async_checkpoint.py [--nproc 2] [--saves 3] [--out-dir benchmarks/results]

JSON (stdout, and ``<out-dir>/async_checkpoint-<time>.json`` when given): per mode the per-save
stalls, call, wait and after-step seconds, the checkpoint's bytes; ``ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"vocab_size": 8192, "seq_len": 32, "n_layer": 16, "n_head": 16, "d_model": 1024}
CONFIG = {"train_batch_size": None, "train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7,
                                "allgather_bucket_size": 5e7}}


def measure(nproc: int = 2, saves: int = 3, baseline_steps: int = 3, after_steps: int = 3,
            ckpt_root: str | None = None, model: dict | None = None) -> dict:
    """Run the sync and the async job; the stall per save of each and their ratio."""
    model = dict(MODEL, **(model or {}))
    out = {"model": model, "nproc": nproc, "zero_stage": 2, "device": "cpu",
           "saves": saves, "baseline_steps": baseline_steps, "after_steps": after_steps}
    for mode in ("sync", "async"):
        work = Path(tempfile.mkdtemp(prefix=f"bench_ackpt_{mode}_", dir=ckpt_root))
        try:
            out[mode] = _run_job(work, nproc, mode == "async", saves, baseline_steps,
                                 after_steps, model)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out["ratio"] = round(out["async"]["stall_median_s"] / out["sync"]["stall_median_s"], 3)
    out["ratio_blocked"] = round(out["async"]["blocked_median_s"]
                                 / out["sync"]["blocked_median_s"], 3)
    return out


def _run_job(work: Path, nproc, async_save, saves, baseline_steps, after_steps, model) -> dict:
    cfg = dict(CONFIG, train_batch_size=nproc)
    (work / "config.json").write_text(json.dumps(cfg))
    cmd = [str(Path(sys.executable).with_name("dslaunch")), "run", "--nproc-per-node", str(nproc),
           "--omp-threads", str(max(1, (os.cpu_count() or 2) // nproc)), "--config",
           str(work / "config.json"), __file__, "--rank-worker", "--work", str(work),
           "--async-save", str(int(async_save)), "--saves", str(saves),
           "--baseline-steps", str(baseline_steps), "--after-steps", str(after_steps),
           "--model", json.dumps(model)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode != 0:
        raise RuntimeError(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads((work / "rank_0.json").read_text())


# -- the rank side (run by dslaunch run) -------------------------------------------------------

def _rank_worker(args) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    import dslaunch
    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**json.loads(args.model)))
    # the config comes from the launcher (--config), through the environment
    engine, *_ = dslaunch.initialize(model=gpt, model_parameters=gpt.parameters())
    seq, vocab = gpt.cfg.seq_len, gpt.cfg.vocab_size
    g = torch.Generator().manual_seed(engine.global_rank)

    def step() -> float:
        t = time.perf_counter()
        tok = torch.randint(0, vocab, (1, seq), generator=g)
        loss = engine(tok, tok)
        engine.backward(loss)
        engine.step()
        return time.perf_counter() - t

    for _ in range(2):  # warm-up (allocations, first optimizer step)
        step()
    base = statistics.median(step() for _ in range(args.baseline_steps))
    ckpt = os.path.join(args.work, "ckpt")
    rows = []
    for _ in range(args.saves):
        t = time.perf_counter()
        engine.save_checkpoint(ckpt, async_save=bool(args.async_save), keep_last=1)
        call = time.perf_counter() - t
        after = [step() for _ in range(args.after_steps)]
        t = time.perf_counter()
        engine.wait_checkpoint()
        wait = time.perf_counter() - t
        extra = sum(s - base for s in after)
        rows.append({"call_s": round(call, 3), "wait_s": round(wait, 3),
                     "after_steps_extra_s": round(extra, 3),
                     "blocked_s": round(call + wait, 3),
                     "stall_s": round(call + wait + max(extra, 0.0), 3)})
    tag = open(os.path.join(ckpt, "latest")).read().strip()
    size = sum(f.stat().st_size for f in Path(ckpt, tag).iterdir())
    rec = {"async_save": bool(args.async_save), "params": gpt.num_params(),
           "baseline_step_s": round(base, 3), "checkpoint_bytes": size, "per_save": rows,
           "stall_median_s": round(statistics.median(r["stall_s"] for r in rows), 3),
           "blocked_median_s": round(statistics.median(r["blocked_s"] for r in rows), 3)}
    if engine.global_rank == 0:
        Path(args.work, "rank_0.json").write_text(json.dumps(rec))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--baseline-steps", type=int, default=3)
    p.add_argument("--after-steps", type=int, default=3)
    p.add_argument("--ckpt-root", default=None, help="where the checkpoints go (a temp dir)")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--async-save", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--model", default=json.dumps(MODEL), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_worker:
        _rank_worker(args)
        return 0
    result = measure(args.nproc, args.saves, args.baseline_steps, args.after_steps,
                     args.ckpt_root, json.loads(args.model))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out_dir:
        path = Path(args.out_dir, f"async_checkpoint-{time.strftime('%Y%m%d-%H%M%S')}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
