"""One training run of the example GPT (examples/gpt.py) at one sequence length, for
bench_long_seq_memory.py: its peak RSS, the losses, the seconds per step. One process per
measurement, so the peak (ru_maxrss) is this run's alone.

    python long_seq_memory_rank.py --impl dslaunch|deepspeed --mode plain|ckpt|tiled|ckpt_tiled \
        --seq 4096 --out result.json

``--impl`` picks whose engine and whose memory savers run (dslaunch's ``initialize``,
``dslaunch.checkpointing.checkpoint``, ``dslaunch.sequence.tiled``; or DeepSpeed's
``initialize``, ``deepspeed.checkpointing.checkpoint`` and
``deepspeed.runtime.sequence_parallel.ulysses_sp``'s TiledMLP / TiledFusedLogitsLoss); run it with
that library's Python. ``--mode``: ckpt = checkpointing around each block; tiled = tiled MLP +
tiled logits and loss; ckpt_tiled = both. One rank (sequence parallelism is not in this script).
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
    p.add_argument("--mlp-tiles", type=int, default=0, help="0: seq / 1024, at least 2")
    p.add_argument("--loss-tiles", type=int, default=0, help="0: seq / 512, at least 2")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", required=True)
    return p.parse_args()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    args = parse()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free port: runs may go side by side
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    import torch

    from gpt import GPT, GPTConfig

    if args.impl == "dslaunch":
        import dslaunch as lib
        from dslaunch.sequence.tiled import TiledFusedLogitsLoss, TiledMLP
    else:
        import deepspeed as lib
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss, TiledMLP
    lib.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=args.n_layer,
                          n_head=args.n_head, d_model=args.d_model))
    ckpt, tiled = args.mode in ("ckpt", "ckpt_tiled"), args.mode in ("tiled", "ckpt_tiled")
    mlp_tiles = args.mlp_tiles or max(2, args.seq // 1024)
    loss_tiles = args.loss_tiles or max(2, args.seq // 512)
    model.use_long_sequence(checkpoint=lib.checkpointing.checkpoint if ckpt else None,
                            tiled_mlp=TiledMLP if tiled else None, mlp_tiles=mlp_tiles,
                            tiled_loss=TiledFusedLogitsLoss if tiled else None,
                            loss_tiles=loss_tiles)
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 6}
    if ckpt and args.impl == "dslaunch":  # the section configures dslaunch.checkpointing
        config["activation_checkpointing"] = {"partition_activations": False}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = lib.initialize(model=model, optimizer=optimizer, config=config)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.steps, 1, args.seq + 1), generator=g)
    rss_ready = current_rss()
    losses, seconds = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = engine(tokens[step, :, :-1], tokens[step, :, 1:])
        engine.backward(loss)
        engine.step()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    Path(args.out).write_text(json.dumps({
        "impl": args.impl, "mode": args.mode, "seq": args.seq, "losses": losses,
        "step_seconds": seconds, "peak_rss_bytes": peak_rss(), "rss_before_training": rss_ready,
        "params": sum(p.numel() for p in model.parameters()), "mlp_tiles": mlp_tiles,
        "loss_tiles": loss_tiles, "torch": torch.__version__,
        "version": getattr(lib, "__version__", "?")}))


if __name__ == "__main__":
    main()
