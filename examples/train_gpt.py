"""Train the small byte-level GPT of examples/gpt.py on the Python standard library's source.

    dslaunch run --nproc-per-node 2 examples/train_gpt.py --config configs/gpt_small.json

Uses only dslaunch's public, DeepSpeed-compatible API (``import dslaunch as deepspeed`` style):
``add_config_arguments``, ``initialize``, ``engine(...)``, ``engine.backward``, ``engine.step``,
``save_checkpoint`` / ``load_checkpoint``. The config comes from ``--config`` (or
``--deepspeed_config``) or, when the launcher was given ``--config``, from the environment.
Every rank reads the global batch of step ``s`` and keeps its own rows, so the loss curve does not
depend on the number of ranks.

Long sequences (``--sp N``, Ulysses sequence parallelism, DeepSpeed's ``sequence_parallel_size``):
groups of N ranks share each sample, every rank holding 1/N of its sequence; attention exchanges
q/k/v so each rank attends over the whole sequence for 1/N of the heads. The data-parallel size
is the world size / N. ``configs/gpt_long_context.json`` writes ``sequence_parallel_size: 2``:

    dslaunch run --nproc-per-node 2 examples/train_gpt.py --config configs/gpt_long_context.json \
        --sp 2 --seq-len 2048

Restarts (``dslaunch run --max-restarts``, or a job restarted by hand, on any number of ranks):
with ``--checkpoint-dir`` the script first calls ``engine.load_checkpoint(dir)``, which returns
``(None, None)`` when there is nothing yet and otherwise resumes from ``latest``. Its own data
position goes with every save as ``client_state={"samples_seen": ...}``; on resume it skips the
samples already consumed (docs/resilience.md).
"""

import argparse
import json
import os
import time

import torch

import dslaunch
from dslaunch.sequence.sharding import (
    sequence_parallel_cross_entropy,
    shard_sequence,
)
from dslaunch.utils import groups
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # examples/ is the script's directory


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps to run in total")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20, help="bytes of stdlib text to use")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--save-every", type=int, default=0, help="save every N steps (0: at the end)")
    p.add_argument("--resume", action="store_true",
                   help="(implied by --checkpoint-dir: the latest checkpoint, if any, is loaded)")
    p.add_argument("--log-every", type=int, default=50, help="print loss and tokens/s every N steps")
    p.add_argument("--sp", type=int, default=1,
                   help="sequence-parallel size (Ulysses); must match the config's "
                        "sequence_parallel_size when it writes one")
    p.add_argument("--losses-out", default=None, help="rank 0 writes every step's loss (JSON)")
    p.add_argument("--checkpoint-blocks", action="store_true",
                   help="activation checkpointing around each block (dslaunch.checkpointing; "
                        "the config's activation_checkpointing section configures it)")
    p.add_argument("--tiled-mlp", type=int, default=0, metavar="TILES",
                   help="run each MLP in TILES tiles of the sequence (TiledMLP)")
    p.add_argument("--tiled-loss", type=int, default=0, metavar="TILES",
                   help="logits + loss in TILES tiles: [seq, vocab] never exists "
                        "(TiledFusedLogitsLoss)")
    dslaunch.add_config_arguments(p)
    return p.parse_args()




class SequenceParallel:
    """``--sp N``: the sequence x data grid, attention wrapped in Ulysses' DistributedAttention,
    each sample's sequence sharded over the group and the loss averaged over every shard."""

    def __init__(self, model, size: int):
        self.size, self.mpu, self.rank, self.group = size, None, 0, None
        if size == 1:
            return
        from dslaunch.engine.parallel.topology import build_grid
        from dslaunch.sequence.layer import DistributedAttention

        self.mpu = build_grid(sequence=size)
        self.rank, self.group = self.mpu.get_sequence_parallel_rank(), self.mpu.sequence_group
        model.use_sequence_parallel(DistributedAttention, self.group, self.rank)

    def check(self):
        have = groups._get_sequence_parallel_world_size()
        if have != self.size:
            raise SystemExit(f"the config's sequence_parallel_size is {have}: pass --sp {have}")

    def shard(self, t):
        return t if self.size == 1 else shard_sequence(t, self.rank, self.size)

    def loss(self, engine, tokens, targets):
        if self.size == 1:
            return engine(tokens, targets)
        return sequence_parallel_cross_entropy(engine(tokens), targets, self.group)


def compress_if_configured(model, args):
    """A config with a compression_training section (configs/compression_gpt.json): swap the
    chosen nn.Linear for DeepSpeed's compressed layers; the engine steps the schedule."""
    path = getattr(args, "deepspeed_config", None)
    text = open(path).read() if path else os.environ.get("DSLAUNCH_CONFIG", "")
    if "compression_training" in text:
        from dslaunch.compression import init_compression

        init_compression(model, text)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(seq_len=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                    d_model=args.d_model)
    model = GPT(cfg)
    if args.checkpoint_blocks or args.tiled_mlp or args.tiled_loss:  # long-sequence memory savers
        from dslaunch.sequence.tiled import TiledFusedLogitsLoss, TiledMLP

        model.use_long_sequence(
            checkpoint=dslaunch.checkpointing.checkpoint if args.checkpoint_blocks else None,
            tiled_mlp=TiledMLP if args.tiled_mlp else None, mlp_tiles=args.tiled_mlp,
            tiled_loss=TiledFusedLogitsLoss if args.tiled_loss else None,
            loss_tiles=args.tiled_loss)
    compress_if_configured(model, args)  # before initialize, as DeepSpeed's init_compression
    sp = SequenceParallel(model, args.sp)  # before initialize: ZeRO-3 hooks the final modules
    engine, _, _, _ = dslaunch.initialize(args=args, model=model, mpu=sp.mpu,
                                          model_parameters=model.parameters())
    sp.check()
    # data-parallel rank and size: which rows of the global batch this rank's group takes
    rank, world = groups._get_data_parallel_rank(), groups._get_data_parallel_world_size()
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    data = TextBatches(stdlib_bytes(args.data_bytes), seq_len=args.seq_len,
                       global_batch=engine.train_batch_size(), seed=args.seed)
    if engine.global_rank == 0:
        print(f"model {model.num_params() / 1e6:.2f}M params | world {world} | micro {micro} x "
              f"accum {accum} x ranks {world} = batch {engine.train_batch_size()} x seq "
              f"{args.seq_len}", flush=True)

    samples_seen = 0  # the data position: global samples consumed so far
    if args.checkpoint_dir:  # resume from the newest complete checkpoint, if there is one
        path, client = engine.load_checkpoint(args.checkpoint_dir)
        if path is not None:
            samples_seen = client.get("samples_seen", engine.global_samples)
            if engine.global_rank == 0:
                print(f"resumed from {path} at step {engine.global_steps} ({samples_seen} samples "
                      "seen)", flush=True)

    batch = engine.train_batch_size()  # the same at any world size (elasticity keeps it)
    tokens_per_step = batch * args.seq_len
    t0, start = time.perf_counter(), engine.global_steps
    losses = []
    for step in range(engine.global_steps, args.steps):
        # skip what was consumed: this data source is addressed by global batch index, so the
        # position is samples_seen // batch (a streaming loader would skip samples_seen samples)
        tokens, targets = data.batch_at(samples_seen // batch, rank, world)
        tokens, targets = sp.shard(tokens), sp.shard(targets)  # targets are already shifted
        samples_seen += batch
        tokens, targets = tokens.to(engine.device), targets.to(engine.device)  # as with DeepSpeed
        for i in range(accum):
            sl = slice(i * micro, (i + 1) * micro)
            loss = sp.loss(engine, tokens[sl], targets[sl])
            engine.backward(loss)
            engine.step()
        if args.losses_out:  # the global batch's loss: the mean over the data-parallel ranks
            mean = loss.detach().clone()
            dslaunch.comm.all_reduce(mean, group=groups._get_data_parallel_group())
            losses.append(mean.item() / world)
        done = step + 1
        if args.checkpoint_dir and args.save_every and done % args.save_every == 0:
            engine.save_checkpoint(args.checkpoint_dir, client_state={"samples_seen": samples_seen})
        if engine.global_rank == 0 and (done % args.log_every == 0 or done == args.steps):
            rate = (done - start) * tokens_per_step / (time.perf_counter() - t0)
            print(f"step {done:5d} | loss {loss.item():.4f} | lr {engine.get_lr()[0]:.2e} | "
                  f"{rate:,.0f} tokens/s", flush=True)
    if args.checkpoint_dir and not args.save_every:
        engine.save_checkpoint(args.checkpoint_dir, client_state={"samples_seen": samples_seen})
    engine.wait_checkpoint()  # a background save (checkpoint.async_save) is complete
    if args.losses_out and engine.global_rank == 0:
        with open(args.losses_out, "w") as f:
            json.dump({"losses": losses, "sp": sp.size, "dp": world}, f)
    if engine.global_rank == 0:
        elapsed = time.perf_counter() - t0
        print(f"done: {args.steps - start} steps in {elapsed:.1f}s, "
              f"{(args.steps - start) * tokens_per_step / max(elapsed, 1e-9):,.0f} tokens/s",
              flush=True)


if __name__ == "__main__":
    main()
