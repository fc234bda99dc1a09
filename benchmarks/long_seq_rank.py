"""One rank of bench_long_seq.py: the example GPT (examples/gpt.py) trained for a few steps on one
long sequence per data-parallel rank, under dslaunch or DeepSpeed (the peer venv), with Ulysses
sequence parallelism (``--sp N``: each runtime's own ``DistributedAttention``) or plain data
parallelism (``--sp 1``). Both runtimes get the same model, data, torch AdamW and ZeRO stage.

    dslaunch run --nproc-per-node 2 benchmarks/long_seq_rank.py --runtime dslaunch --sp 2 --seq 4096 --out DIR
    <peer-venv>/bin/torchrun --nproc-per-node 2 benchmarks/long_seq_rank.py --runtime deepspeed ...

Rank 0 writes DIR/result.json: step times (between barriers), tokens per step, losses.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", choices=["dslaunch", "deepspeed"], required=True)
    p.add_argument("--sp", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--n-layer", type=int, default=1)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", required=True)
    return p.parse_args()




def sequence_layout(runtime, sp):
    """(mpu, sequence group, sequence rank) of each runtime; (None, None, 0) without SP."""
    if sp == 1:
        return None, None, 0
    if runtime == "dslaunch":
        from dslaunch.engine.parallel.topology import build_grid

        grid = build_grid(sequence=sp)
        return grid, grid.sequence_group, grid.sp_rank
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu

    mpu.initialize_sequence_parallel(sequence_parallel_size=sp)
    return mpu, mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()


def main():
    args = parse_args()
    if args.runtime == "dslaunch":
        import dslaunch as ds
        from dslaunch.sequence.layer import DistributedAttention
    else:
        import deepspeed as ds
        from deepspeed.sequence.layer import DistributedAttention
    ds.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mpu, group, sp_rank = sequence_layout(args.runtime, args.sp)
    dp, dp_rank = world // args.sp, rank // args.sp  # sequence groups are neighbouring ranks

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                          d_model=args.d_model))
    if args.sp > 1:
        model.use_sequence_parallel(DistributedAttention, group, sp_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1}, "steps_per_print": 10 ** 6}
    engine, _, _, _ = ds.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)

    local = args.seq // args.sp
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        sample = torch.randint(0, 256, (1, args.seq + 1), generator=g)
        tokens, targets = sample[:, :-1], sample[:, 1:]
        tokens = tokens[:, sp_rank * local:(sp_rank + 1) * local].contiguous()
        targets = targets[:, sp_rank * local:(sp_rank + 1) * local].contiguous()
        dist.barrier()
        t0 = time.perf_counter()
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    if rank == 0:
        step_s = statistics.median(times)
        result = {"runtime": args.runtime, "sp": args.sp, "dp": dp, "world": world,
                  "seq": args.seq, "tokens_per_step": dp * args.seq, "times": times,
                  "median_step_s": step_s, "tokens_per_s": round(dp * args.seq / step_s, 1),
                  "losses": losses, "params": sum(p.numel() for p in model.parameters())}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main()
