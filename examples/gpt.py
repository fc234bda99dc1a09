"""A small GPT and a byte-level text stream, in plain PyTorch (no dslaunch import).

Shared by the example training script, the tests and the benchmarks, so every peer (dslaunch,
DDP, FSDP, DeepSpeed) trains exactly the same model on exactly the same data.
The text is the source of Python's standard library, which is on every machine: no download.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 256  # byte-level
    seq_len: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    dropout: float = 0.0


class LocalCausalAttention(nn.Module):
    """Causal attention over q, k, v in ``[batch, seq, heads, head_dim]``; Ulysses sequence
    parallelism wraps it (``DistributedAttention(attn.core, group)``: the whole sequence, some
    heads)."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v):
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return y.transpose(1, 2)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.core = LocalCausalAttention(cfg.dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head) for z in (q, k, v))
        return self.proj(self.core(q, k, v).reshape(b, t, c))


class MLP(nn.Module):
    tiled = None  # (TiledMLP, tiles): run a few rows of the sequence at a time (use_long_sequence)

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        if self.tiled is not None:
            tiled_mlp, tiles = self.tiled
            return tiled_mlp.apply(_mlp, self, x, tiles, list(self.parameters()))
        return _mlp(self, x)


def _mlp(mlp, x):
    return mlp.proj(F.gelu(mlp.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class BatchFirst(nn.Module):
    """A ``DistributedAttention`` (dslaunch's or DeepSpeed's) called as ``Block`` calls its
    attention core: ``(q, k, v)`` in ``[batch, seq, heads, head_dim]``."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, q, k, v):
        return self.attention(q, k, v, 0)  # batch_dim_idx 0: [b, s, h, d]


class GPT(nn.Module):
    """Decoder-only transformer. ``forward(tokens, targets=None)`` returns logits, or the mean
    cross-entropy loss when targets are given."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.sp_rank = 0  # sequence parallel: tokens are this block of the sequence (positions)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens, targets=None):
        t = tokens.shape[1]
        pos = torch.arange(self.sp_rank * t, (self.sp_rank + 1) * t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = self.checkpoint(block, x) if self.checkpoint is not None else block(x)
        if targets is not None and self.tiled_loss is not None:
            tiled_loss, tiles = self.tiled_loss
            n = targets.numel()  # each tile adds its share of the mean: exact with uneven tiles
            return tiled_loss.apply(lambda head, x, y: F.cross_entropy(
                head(x).float(), y.reshape(-1), reduction="sum") / n, self.head, self.ln_f(x),
                targets, None, tiles, [self.head.weight], "sum")
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    checkpoint = None  # a checkpoint(function, *args) run around each block (use_long_sequence)
    tiled_loss = None  # (TiledFusedLogitsLoss, tiles)

    def use_sequence_parallel(self, distributed_attention, group, rank: int) -> None:
        """Ulysses: every block's attention core becomes ``distributed_attention(core, group)``
        (the class of the library in use), and positions start at this rank's sequence block."""
        self.sp_rank = rank
        for block in self.blocks:
            block.attn.core = BatchFirst(distributed_attention(block.attn.core, group))

    def use_long_sequence(self, checkpoint=None, tiled_mlp=None, mlp_tiles=4, tiled_loss=None,
                          loss_tiles=8):
        """Long-sequence memory savers, from dslaunch or DeepSpeed (the same signatures):
        ``checkpoint`` (``dslaunch.checkpointing.checkpoint``) around each block, the MLPs run in
        ``mlp_tiles`` tiles by ``tiled_mlp`` (``TiledMLP``), the logits + loss in ``loss_tiles``
        by ``tiled_loss`` (``TiledFusedLogitsLoss``): the ``[seq, vocab]`` logits never exist."""
        self.checkpoint = checkpoint
        for block in self.blocks:
            block.mlp.tiled = (tiled_mlp, mlp_tiles) if tiled_mlp is not None else None
        self.tiled_loss = (tiled_loss, loss_tiles) if tiled_loss is not None else None
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def stdlib_bytes(max_bytes: int = 8 << 20) -> torch.Tensor:
    """The first ``max_bytes`` of the standard library's .py files (sorted, so every rank and
    every machine with the same Python reads the same bytes) as a uint8 tensor."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


class TextBatches:
    """Deterministic batches of (tokens, targets) from a byte stream.

    The global batch of step ``s`` is the same whatever the world size; rank ``r`` of ``n`` takes
    rows ``r::n`` of it, so a data-parallel run sees exactly the data of a single-process run.
    ``vocab_size`` < 256 folds bytes into range (used by benchmarks with bigger vocabularies too).
    """

    def __init__(self, data: torch.Tensor, seq_len: int, global_batch: int, seed: int = 0,
                 vocab_size: int = 256):
        self.data = data.long() % vocab_size
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed

    def global_batch_at(self, step: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (self.global_batch,), generator=g)
        rows = torch.stack([self.data[s : s + self.seq_len + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]

    def batch_at(self, step: int, rank: int = 0, world: int = 1):
        tokens, targets = self.global_batch_at(step)
        return tokens[rank::world].contiguous(), targets[rank::world].contiguous()


def bench_config(vocab_size: int = 8192) -> GPTConfig:
    """The benchmarks' model (benchmarks/README.md): 6 layers, hidden 512, 8 heads, seq 128
    (27.4M params with vocab 8192)."""
    return GPTConfig(vocab_size=vocab_size, seq_len=128, n_layer=6, n_head=8, d_model=512)


def _self_check():
    torch.manual_seed(0)
    model = GPT(bench_config())
    print(f"bench model params: {model.num_params() / 1e6:.1f}M")
    batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=4)
    tok, tgt = batches.batch_at(0)
    small = GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))
    loss = small(tok, tgt)
    assert abs(loss.item() - math.log(256)) < 0.5, loss.item()
    print("ok", loss.item())


if __name__ == "__main__":
    _self_check()
