#!/usr/bin/env python
"""Where a ZeRO-Offload step's time goes, in one process (world size 1): forward, backward (with the
gradients' copies to the host), and the step (norm, CPU optimizer, copies back), each timed with
the device synchronized, for dslaunch's pipelined path and, with ``--plain``, for the path without
the fused step (scale, step, convert and upload one after another).

    python benchmarks/bench_offload_step.py --device cuda --size 355m --stage 2 --steps 8
    python benchmarks/bench_offload_step.py --device cpu --size tiny --steps 3   # a smoke run

A GPT-2 (transformers' GPT2LMHeadModel from a config, random init, bf16), micro-batch x seq
tokens of random ids; optimizer AdamW from the config, gradient_clipping 1.0. JSON to stdout
and, with --out, to a file: per phase the median seconds over the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {"tiny": (2, 64, 2), "125m": (12, 768, 12), "355m": (24, 1024, 16), "1.3b": (24, 2048, 16)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="355m", choices=sorted(SIZES))
    ap.add_argument("--stage", type=int, default=2, choices=[1, 2])
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--plain", action="store_true", help="without the fused step")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import dslaunch
    from dslaunch.engine.zero.offload_pipeline import HostOffload, optimizer_threads

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531", "RANK": "0",
                 "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    if a.plain:
        HostOffload.fuses = staticmethod(lambda optimizer: False)
    layers, hidden, heads = SIZES[a.size]
    seq = min(a.seq, 128) if a.size == "tiny" else a.seq
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads,
                                       n_positions=max(seq, 128), vocab_size=50257))
    n_params = sum(p.numel() for p in model.parameters())
    if a.device == "cuda":
        model = model.cuda()
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_clipping": 1.0,
           "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
           "zero_optimization": {"stage": a.stage, "overlap_comm": True,
                                 "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    dev = engine.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    phases = {"forward": [], "backward": [], "step": [], "total": []}
    losses = []
    g = torch.Generator().manual_seed(1)
    for i in range(a.warmup + a.steps):
        ids = torch.randint(0, 50257, (a.micro_batch, seq), generator=g).to(dev)
        sync()
        t0 = time.perf_counter()
        loss = engine(ids, labels=ids).loss
        sync()
        t1 = time.perf_counter()
        engine.backward(loss)
        sync()
        t2 = time.perf_counter()
        engine.step()
        sync()
        t3 = time.perf_counter()
        losses.append(round(loss.item(), 5))
        if i >= a.warmup:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                phases[k].append(v)
        print(json.dumps({"step": i, "loss": losses[-1], "seconds": round(t3 - t0, 4),
                          "forward": round(t1 - t0, 4), "backward": round(t2 - t1, 4),
                          "step_s": round(t3 - t2, 4)}), file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in phases.items()}
    result = {"bench": "offload_step", "device": torch.cuda.get_device_name() if dev.type == "cuda"
              else "cpu", "size": a.size, "params": n_params, "stage": a.stage,
              "path": "plain" if a.plain else "fused", "micro_batch": a.micro_batch, "seq": seq,
              "optimizer_threads": optimizer_threads(), "torch_threads": torch.get_num_threads(),
              "median_seconds": {k: round(v, 4) for k, v in med.items()},
              "tokens_per_s": round(a.micro_batch * seq / med["total"], 1),
              "peak_gpu_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None,
              "losses": losses}
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
