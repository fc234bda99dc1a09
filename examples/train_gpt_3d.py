"""Train examples/gpt.py's GPT with pipeline + tensor + data parallelism on one 3D grid.

    dslaunch run --nproc-per-node 4 examples/train_gpt_3d.py --pp 2 --tp 2 \
        --config configs/pipe_tp_gpt.json

Ranks are laid out pipe x data x model (DeepSpeed's order; the data-parallel size is what the
world size leaves: 8 ranks with --pp 2 --tp 2 train 2 data replicas). The model is a list of
layer specs: vocab-parallel token embedding, transformer Blocks whose attention heads and MLP
are split over the model group (examples/gpt_tp.py's BLOCK_TP_PLAN), a final LayerNorm, and a
column-parallel head whose vocabulary-split logits go straight into the vocab-parallel
cross-entropy (never gathered).
``engine.train_batch(data_iter)`` runs one optimizer step over ``gradient_accumulation_steps``
micro-batches (1F1B; ``{"dslaunch": {"pipe_schedule": "gpipe"}}`` for GPipe) and returns the
batch loss on every rank. Every data replica reads the global batch of step ``s`` and keeps its
own rows, so the loss curve does not depend on the layout.

configs/pipe_3d_bf16_zero1.json adds bf16, gradient clipping (global norm over stages and TP
ranks) and ZeRO stage 1 over the data-parallel group. With ``--save-dir`` the last step is saved
(one file per stage and TP rank); ``dslaunch ckpt to-fp32 DIR model.pt`` turns that into one
plain fp32 state_dict named like the unpartitioned PipelineModule (``N.param``), which
``dslaunch.pipe.load_consolidated(module, "model.pt")`` loads into these layers built with
``--tp 1`` on one stage.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import dslaunch
from dslaunch.engine.parallel.tensor_parallel import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    tp_manual_seed,
    vocab_parallel_cross_entropy,
)
from dslaunch.engine.parallel.topology import get_grid
from dslaunch.engine.parallel.tp_plan import apply_tp_plan
from dslaunch.pipe import LayerSpec, PipelineModule, PipeModelDataParallelTopology
from gpt import Block, GPTConfig, TextBatches, stdlib_bytes  # examples/ is the script's directory
from gpt_tp import BLOCK_TP_PLAN


class Embedding(nn.Module):
    def __init__(self, cfg, group):
        super().__init__()
        self.tok_emb = VocabParallelEmbedding.from_embedding(_embedding(cfg), group)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    def forward(self, tokens):
        return self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1],
                                                                device=tokens.device))


def _embedding(cfg):
    emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
    nn.init.normal_(emb.weight, std=0.02)
    return emb


class ParallelBlock(nn.Module):
    def __init__(self, cfg, group):
        super().__init__()
        self.block = apply_tp_plan(Block(cfg), BLOCK_TP_PLAN, group)

    def forward(self, x):
        return self.block(x)


class Head(nn.Module):
    def __init__(self, cfg, group):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(head.weight, std=0.02)
        self.head = ColumnParallelLinear.from_linear(head, group, gather_output=False)

    def forward(self, x):
        return self.head(self.ln_f(x))  # this rank's slice of the vocabulary


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partition", default="parameters", help="parameters | uniform | type:REGEX")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save-dir", help="save a checkpoint after the last step")
    dslaunch.add_config_arguments(p)
    return p.parse_args()


def main():
    args = parse_args()
    dslaunch.init_distributed()
    world = dist.get_world_size()
    if world % (args.pp * args.tp):
        raise SystemExit(f"train_gpt_3d: {world} ranks do not factor into --pp {args.pp} x "
                         f"--tp {args.tp} x data parallel")
    topo = PipeModelDataParallelTopology(num_pp=args.pp, num_mp=args.tp,
                                         num_dp=world // (args.pp * args.tp))
    grid = get_grid(topo)
    group = grid.model_group
    tp_manual_seed(args.seed, group)  # dropout: same outside TP regions, per-rank inside
    cfg = GPTConfig(seq_len=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                    d_model=args.d_model)
    layers = ([LayerSpec(Embedding, cfg, group)]
              + [LayerSpec(ParallelBlock, cfg, group) for _ in range(cfg.n_layer)]
              + [LayerSpec(Head, cfg, group)])

    def loss_fn(logits, targets):
        return vocab_parallel_cross_entropy(logits, targets, group).mean()

    model = PipelineModule(layers, topology=topo, loss_fn=loss_fn, seed_layers=True,
                           base_seed=args.seed, partition_method=args.partition)
    engine, _, _, _ = dslaunch.initialize(args=args, model=model)
    mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    batches = TextBatches(stdlib_bytes(4 << 20), seq_len=cfg.seq_len,
                          global_batch=engine.train_batch_size(), seed=args.seed)
    if dist.get_rank() == 0:
        print(f"[train_gpt_3d] grid pipe {grid.num_stages} x data {grid.dp_world_size} x model "
              f"{grid.tp_world_size}; layers per stage {model.parts}; micro {mb} x {gas} "
              f"micro-batches x {grid.dp_world_size} replicas", flush=True)
    t0 = time.perf_counter()
    for step in range(args.steps):
        tokens, targets = batches.batch_at(step, grid.dp_rank, grid.dp_world_size)
        micro = iter([(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
                      for i in range(gas)])
        loss = engine.train_batch(micro)
        if dist.get_rank() == 0 and ((step + 1) % args.log_every == 0 or step == 0):
            rate = (step + 1) * engine.train_batch_size() * cfg.seq_len / (time.perf_counter() - t0)
            print(f"[train_gpt_3d] step {step + 1} loss {loss.item():.4f} tokens/s {rate:,.0f}",
                  flush=True)
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
        if dist.get_rank() == 0:
            print(f"[train_gpt_3d] saved {args.save_dir}; consolidate with: dslaunch ckpt "
                  f"to-fp32 {args.save_dir} model.pt", flush=True)


if __name__ == "__main__":
    main()
