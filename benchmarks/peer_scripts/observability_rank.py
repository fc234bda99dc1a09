"""Rank script of bench_observability.py: the same code measures dslaunch and DeepSpeed, through
the API they share (``initialize``, ``comm.configure``, ``profiling.flops_profiler``).

    dslaunch run --nproc-per-node 2 observability_rank.py --impl dslaunch --out DIR
    <peer-venv>/torchrun --standalone --nproc-per-node 2 observability_rank.py --impl deepspeed --out DIR

ZeRO-2, the bench GPT (``--smoke``: the tiny one). After the warm-up, per ``--blocks`` round:

- comms logger: ``--steps`` steps with the logger enabled (``comm.configure(enabled=True)``,
  every op profiled), then ``--steps`` with it disabled, alternating which comes first;
- FLOPs profiler: one step profiled as the engine profiles one (``start_profile`` before the
  forward, ``stop_profile`` after it, the backward and step, ``end_profile``) on every rank,
  next to one plain step.

Writes rank<N>.json: the step seconds per mode, tokens per step, the profiler's counts and the
collectives per step.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
from zero_config import train_config


def main():
    p = common.parser(__doc__)
    p.add_argument("--impl", choices=["dslaunch", "deepspeed"], required=True)
    p.add_argument("--blocks", type=int, default=4)
    args = p.parse_args()
    if args.impl == "deepspeed":
        import deepspeed as ds
        import deepspeed.comm as comm
        from deepspeed.profiling.flops_profiler import FlopsProfiler

        ds.init_distributed(dist_backend="gloo")
    else:
        import dslaunch as ds
        import dslaunch.comm as comm
        from dslaunch.profiling.flops_profiler import FlopsProfiler
    import torch.distributed as dist

    model = common.build_model(args)
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(),
                               config=train_config(2, micro_batch=args.micro_batch))
    rank, world = dist.get_rank(), dist.get_world_size()
    args.steps = args.blocks * 3 * args.steps
    batches = common.build_batches(args, rank, world)
    it = iter(batches)

    def step(profiler=None):
        tokens, targets = next(it)
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.start_profile()
        loss = engine(tokens, targets)
        if profiler is not None:
            profiler.stop_profile()
        engine.backward(loss)
        engine.step()
        dt = time.perf_counter() - t0
        if profiler is not None:
            counts = (profiler.get_total_flops(), profiler.get_total_macs(),
                      profiler.get_total_params())
            profiler.end_profile()
            return dt, counts
        return dt, None

    for _ in range(args.warmup):
        step()
    per_block = (args.steps // args.blocks) // 3
    times = {"logger_on": [], "logger_off": [], "profiled": [], "plain": []}
    counts = None
    calls_before = sum(v["calls"] for v in engine.comm_stats().values()) \
        if hasattr(engine, "comm_stats") else None
    for b in range(args.blocks):
        order = (True, False) if b % 2 == 0 else (False, True)
        for on in order:
            comm.configure(enabled=on, prof_all=True)
            for _ in range(per_block):
                times["logger_on" if on else "logger_off"].append(step()[0])
        comm.configure(enabled=False)
        for _ in range(per_block // 2 or 1):
            dt, counts = step(FlopsProfiler(engine.module))
            times["profiled"].append(dt)
            times["plain"].append(step()[0])
    calls = None
    if calls_before is not None:
        calls_after = sum(v["calls"] for v in engine.comm_stats().values())
        calls = (calls_after - calls_before) / sum(len(v) for v in times.values())
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"impl": args.impl, "world": world, "times": times,
                   "tokens_per_step": args.micro_batch * common.model_config(args).seq_len * world,
                   "profile_counts": counts, "collectives_per_step": calls,
                   "version": getattr(ds, "__version__", "?")}, f)


if __name__ == "__main__":
    main()
