"""1-bit Adam / 0/1 Adam / 1-bit LAMB vs Adam / LAMB: losses and bytes, measured.

Each optimizer trains the example GPT on N ranks (gloo) through `dslaunch run` with
tests/scripts/onebit_train.py, which records every step's loss and the bytes each collective
booked in ``engine.comm_stats()`` (payload bytes: what this rank handed to the collective). The
warmup (``freeze_step`` / ``var_freeze_step``) is ``--warmup-frac`` of the steps (15%, DeepSpeed's
figure). Reported per optimizer: the loss curve and final mean loss, the bytes per rank per step
in the warmup and in the compression stage, their ratio to an fp32 all-reduce of the same
gradients (measured on the Adam run) and to a bf16 one (half of it), the end-to-end ratio, and the
same ratios in estimated wire bytes (ring all-reduce 2(w-1)/w x payload, all_to_all (w-1)/w x,
all_gather (w-1) x). DeepSpeed's published figures for reference: up to 5x less communication end
to end, 16x less in the compression stage vs fp16 gradients.

    python benchmarks/bench_onebit.py --nproc 2 --steps 200 --out benchmarks/results/onebit.json
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dslaunch.engine.compressed import wire_bytes  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "onebit_train.py"


def optimizer_configs(steps: int, warmup: int, lr: float) -> dict:
    common = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    return {
        "Adam": {"type": "Adam", "params": dict(common)},
        "OneBitAdam": {"type": "OneBitAdam", "params": {**common, "freeze_step": warmup}},
        "ZeroOneAdam": {"type": "ZeroOneAdam", "params": {
            **common, "var_freeze_step": warmup, "var_update_scaler": 4,
            "local_step_scaler": max(1, (steps - warmup) // 4), "local_step_clipper": 4}},
        "Lamb": {"type": "Lamb", "params": dict(common)},
        "OneBitLamb": {"type": "OneBitLamb", "params": {**common, "freeze_step": warmup}},
    }


def run(name, opt, args, workdir: Path) -> list:
    cfg = {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1,
           "steps_per_print": 10 ** 9, "optimizer": opt}
    cfg_path = workdir / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    out = workdir / name
    cmd = [sys.executable, "-c", "import sys; from dslaunch.cli import main; sys.exit(main())",
           "run", "--nproc-per-node", str(args.nproc),
           str(SCRIPT), "--out", str(out), "--steps", str(args.steps), "--layers",
           str(args.layers), "--d-model", str(args.d_model), "--seq", str(args.seq),
           "--deepspeed_config", str(cfg_path)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name}: job failed\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    recs = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(args.nproc)]
    recs[0]["wall_s"] = time.perf_counter() - t0
    return recs


def summarise(rec: dict, fp32_step: float, world: int) -> dict:
    steps = rec["step_bytes"]
    warm = [sum(b.values()) for b, c in zip(steps, rec["compressing"]) if not c]
    comp = [sum(b.values()) for b, c in zip(steps, rec["compressing"]) if c]

    def wire(b):
        return sum(wire_bytes(k, v, world) for k, v in b.items())

    wire_comp = [wire(b) for b, c in zip(steps, rec["compressing"]) if c]
    total = sum(sum(b.values()) for b in steps)
    total_wire = sum(wire(b) for b in steps)
    fp32_wire = wire_bytes("all_reduce", fp32_step, world)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    out = {
        "final_loss_mean_last10": sum(rec["losses"][-10:]) / 10,
        "losses": rec["losses"],
        "bytes_per_step": [sum(b.values()) for b in steps],
        "warmup_steps": len(warm), "compression_steps": len(comp),
        "bytes_per_step_warmup": mean(warm), "bytes_per_step_compression": mean(comp),
        "total_bytes": total, "total_wire_bytes_est": total_wire,
        "ratio_end_to_end_vs_fp32": fp32_step * len(steps) / total if total else None,
        "ratio_end_to_end_vs_fp32_wire": fp32_wire * len(steps) / total_wire if total_wire else None,
        "wall_s": rec.get("wall_s"),
    }
    if comp:
        out["ratio_compression_vs_fp32"] = fp32_step / mean(comp)
        out["ratio_compression_vs_bf16"] = fp32_step / 2 / mean(comp)
        out["ratio_compression_vs_fp32_wire"] = fp32_wire / mean(wire_comp)
        out["ratio_compression_vs_bf16_wire"] = fp32_wire / 2 / mean(wire_comp)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup-frac", type=float, default=0.15)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--only", default="", help="comma list of optimizers (default: all)")
    p.add_argument("--out", default="", help="JSON file (default: stdout only)")
    args = p.parse_args(argv)
    warmup = max(1, round(args.steps * args.warmup_frac))
    configs = optimizer_configs(args.steps, warmup, args.lr)
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only.split(",")}
    result = {"bench": "onebit", "nproc": args.nproc, "steps": args.steps, "warmup": warmup,
              "model": {"layers": args.layers, "d_model": args.d_model, "seq": args.seq},
              "micro_batch": args.micro_batch, "lr": args.lr, "optimizers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        recs = {name: run(name, opt, args, Path(tmp)) for name, opt in configs.items()}
    n_params = next(iter(recs.values()))[0]["num_params"]
    fp32_step = 4.0 * n_params  # what an fp32 all-reduce of the gradients books per step
    result["num_params"] = n_params
    result["fp32_allreduce_bytes_per_step"] = fp32_step
    for name, r in recs.items():
        result["optimizers"][name] = summarise(r[0], fp32_step, args.nproc)
        result["optimizers"][name]["ranks_in_sync"] = len({x["param_sha"] for x in r}) == 1
    for comp, base in (("OneBitAdam", "Adam"), ("ZeroOneAdam", "Adam"), ("OneBitLamb", "Lamb")):
        if comp in result["optimizers"] and base in result["optimizers"]:
            a = result["optimizers"][comp]["final_loss_mean_last10"]
            b = result["optimizers"][base]["final_loss_mean_last10"]
            result["optimizers"][comp]["final_loss_vs_" + base] = (a - b) / b
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    brief = {k: {kk: v[kk] for kk in v if kk not in ("losses", "bytes_per_step")}
             for k, v in result["optimizers"].items()}
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
