"""One training run of the example GPT (examples/gpt.py) at one sequence length, for
bench_long_seq_memory.py: each rank's peak RSS, the losses, the seconds per step. One process per
rank and measurement, so each peak (ru_maxrss) is that rank's alone.

    python long_seq_memory_rank.py --impl dslaunch|deepspeed --mode plain|ckpt|tiled|ckpt_tiled \
        --seq 4096 --out result.json                                   # one rank, SP 1
    dslaunch run --nproc-per-node 2 long_seq_memory_rank.py --impl dslaunch --sp 2 ...
    <peer-venv>/bin/torchrun --standalone --nproc-per-node 2 long_seq_memory_rank.py \
        --impl deepspeed --sp 2 ...

``--impl`` picks whose engine and whose memory savers run (dslaunch's ``initialize``,
``dslaunch.checkpointing.checkpoint``, ``dslaunch.sequence.tiled``; or DeepSpeed's
``initialize``, ``deepspeed.checkpointing.checkpoint`` and
``deepspeed.runtime.sequence_parallel.ulysses_sp``'s TiledMLP / TiledFusedLogitsLoss); run it with
that library's Python. ``--mode``: ckpt = checkpointing around each block; tiled = tiled MLP +
tiled logits and loss; ckpt_tiled = both.

``--sp N`` (launched on N ranks): Ulysses sequence parallelism as examples/train_gpt.py runs it:
the library's sequence grid (dslaunch's ``build_grid(sequence=N)``; DeepSpeed's
``parallel_state_sp``) passed to ``initialize`` as ``mpu``, every block's attention core wrapped
in that library's ``DistributedAttention``, and each rank given its ``seq / N`` block of the
sample (positions included). Each rank's loss is the mean over its shard, which with equal shards
and no ignored tokens is what ``sequence_parallel_cross_entropy`` gives the gradients (the engine
averages them over the sequence ranks) and keeps the tiled loss usable; the reported loss is the
mean over the group, the whole sequence's mean. Rank 0 writes every rank's figures.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["dslaunch", "deepspeed"], required=True)
    p.add_argument("--mode", choices=["plain", "ckpt", "tiled", "ckpt_tiled"], required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--mlp-tiles", type=int, default=0, help="0: seq / sp / 1024, at least 2")
    p.add_argument("--loss-tiles", type=int, default=0, help="0: seq / sp / 512, at least 2")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel size (= the ranks)")
    p.add_argument("--out", required=True)
    return p.parse_args()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    args = parse()
    if "WORLD_SIZE" not in os.environ:  # not launched: one rank of our own
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free port: runs may go side by side
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    import torch
    import torch.distributed as dist

    from gpt import GPT, GPTConfig

    if args.impl == "dslaunch":
        import dslaunch as lib
        from dslaunch.sequence.tiled import TiledFusedLogitsLoss, TiledMLP
    else:
        import deepspeed as lib
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss, TiledMLP
    lib.init_distributed(dist_backend="gloo")
    if dist.get_world_size() != args.sp:
        raise SystemExit(f"--sp {args.sp} needs {args.sp} ranks, not {dist.get_world_size()}")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=args.n_layer,
                          n_head=args.n_head, d_model=args.d_model))
    ckpt, tiled = args.mode in ("ckpt", "ckpt_tiled"), args.mode in ("tiled", "ckpt_tiled")
    local = args.seq // args.sp  # this rank's rows
    mlp_tiles = args.mlp_tiles or max(2, local // 1024)
    loss_tiles = args.loss_tiles or max(2, local // 512)
    model.use_long_sequence(checkpoint=lib.checkpointing.checkpoint if ckpt else None,
                            tiled_mlp=TiledMLP if tiled else None, mlp_tiles=mlp_tiles,
                            tiled_loss=TiledFusedLogitsLoss if tiled else None,
                            loss_tiles=loss_tiles)
    mpu, group, sp_rank = sequence_parallel(args.impl, args.sp, model)
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 6}
    if ckpt and args.impl == "dslaunch":  # the section configures dslaunch.checkpointing
        config["activation_checkpointing"] = {"partition_activations": False}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = lib.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)
    g = torch.Generator().manual_seed(1)  # the same samples whatever the SP size
    tokens = torch.randint(0, args.vocab, (args.steps, 1, args.seq + 1), generator=g)
    inputs, targets = tokens[:, :, :-1], tokens[:, :, 1:]  # shifted before sharding
    inputs, targets = (t[:, :, sp_rank * local:(sp_rank + 1) * local].contiguous()
                       for t in (inputs, targets))
    rss_ready = current_rss()
    losses, seconds, rss_after_first = [], [], None
    for step in range(args.steps):
        if group is not None:
            dist.barrier()
        start = time.perf_counter()
        loss = engine(inputs[step], targets[step])
        engine.backward(loss)
        engine.step()
        seconds.append(time.perf_counter() - start)
        whole = loss.detach().clone()  # the shard's mean -> the whole sequence's mean
        if group is not None:
            dist.all_reduce(whole, group=group)
        losses.append(whole.item() / args.sp)
        rss_after_first = rss_after_first or current_rss()
    mine = {"peak_rss_bytes": peak_rss(), "rss_before_training": rss_ready,
            "rss_after_first_step": rss_after_first, "step_seconds": seconds}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "impl": args.impl, "mode": args.mode, "seq": args.seq, "sp": args.sp,
            "local_seq": local, "losses": losses, "ranks": ranks,
            "params": sum(p.numel() for p in model.parameters()), "mlp_tiles": mlp_tiles,
            "loss_tiles": loss_tiles, "torch": torch.__version__,
            "version": getattr(lib, "__version__", "?")}))


def sequence_parallel(impl, sp, model):
    """(mpu, sequence group, sequence rank) of ``impl``, the model's attention wrapped in its
    ``DistributedAttention``; (None, None, 0) at SP 1."""
    if sp == 1:
        return None, None, 0
    if impl == "dslaunch":
        from dslaunch.engine.parallel.topology import build_grid
        from dslaunch.sequence.layer import DistributedAttention

        mpu = build_grid(sequence=sp)
        group, rank = mpu.sequence_group, mpu.get_sequence_parallel_rank()
    else:
        import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
        from deepspeed.sequence.layer import DistributedAttention

        mpu.initialize_sequence_parallel(sequence_parallel_size=sp)
        group, rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
    model.use_sequence_parallel(DistributedAttention, group, rank)
    return mpu, group, rank


if __name__ == "__main__":
    main()
