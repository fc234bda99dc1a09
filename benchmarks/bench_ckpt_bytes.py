"""Bytes on disk per parameter of a ZeRO-3 checkpoint: dslaunch's and DeepSpeed's, same model.

    .venv/bin/python benchmarks/bench_ckpt_bytes.py [--dtype fp32|bf16] [--no-peer]

Both engines train the same GPT (examples/gpt.py, d_model 128, 2 layers: about 0.46M
parameters) for one AdamW step on 2 ranks (gloo, CPU) under ZeRO stage 3 and save one
checkpoint; the table lists every file of the tag directory and the total divided by the number
of parameters. The layout's floor for fp32 Adam is 12 bytes per parameter (fp32 master or
weights + exp_avg + exp_avg_sq, each partitioned once over the ranks); the rest is pickle
framing, buffers and counters. DeepSpeed (0.19, the peer venv of ``benchmarks/peers.py``) runs
under its own torchrun; ``--no-peer`` or no peer venv: dslaunch only.

Run as a rank script (``--rank ENGINE OUT``) by the driver, not by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"seq_len": 64, "n_layer": 2, "n_head": 4, "d_model": 128}


def config(dtype: str) -> dict:
    c = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "gradient_clipping": 1.0,
         "zero_optimization": {"stage": 3}, "steps_per_print": 1_000_000}
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def rank_main(engine_name: str, out: str, dtype: str) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import torch
    import torch.distributed as dist

    if engine_name == "deepspeed":
        import deepspeed as ds

        ds.init_distributed(dist_backend="gloo")
    else:
        import dslaunch as ds
    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**MODEL))
    n_params = sum(p.numel() for p in model.parameters())
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(),
                               config=config(dtype))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 256, (2 * world, MODEL["seq_len"] + 1), generator=g)[rank::world]
    loss = engine(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out, tag="t")
    dist.barrier()
    if rank == 0:
        d = os.path.join(out, "t")
        files = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))
                 if f.endswith(".pt")}
        print("RESULT " + json.dumps({"engine": engine_name, "params": n_params, "files": files,
                                      "bytes_per_param": sum(files.values()) / n_params}))
    dist.barrier()


def _result(proc) -> dict:
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def run(engine_name: str, dtype: str, peer_py: str | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        me = str(Path(__file__).resolve())
        if engine_name == "deepspeed":
            argv = [peer_py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    "2", me, "--rank", "deepspeed", tmp, "--dtype", dtype]
        else:
            argv = [str(Path(sys.executable).with_name("dslaunch")), "run", "--nproc-per-node",
                    "2", me, "--rank", "dslaunch", tmp, "--dtype", dtype]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=900)
        return _result(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", nargs=2, metavar=("ENGINE", "OUT"))
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    if args.rank:
        rank_main(args.rank[0], args.rank[1], args.dtype)
        return
    results = [run("dslaunch", args.dtype)]
    if not args.no_peer:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from peers import peer_python

        py = peer_python(create=False, quiet=True)
        if py:
            results.append(run("deepspeed", args.dtype, py))
        else:
            print("(no peer venv: DeepSpeed not measured)")
    for r in results:
        print(f"{r['engine']}: {r['params']} parameters, {sum(r['files'].values())} bytes, "
              f"{r['bytes_per_param']:.2f} bytes/param ({args.dtype}, ZeRO-3, 2 ranks)")
        for f, n in r["files"].items():
            print(f"  {f}: {n}")


if __name__ == "__main__":
    main()
