"""The tiny GPT of examples/gpt.py cut into pipeline layers, for the pipeline/TP tests and their
single-process reference: Embed, Block x n, FinalNorm, Head (or the head tied to Embed)."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt import Block, GPTConfig

CFG = GPTConfig(seq_len=16, n_layer=2, d_model=32, n_head=2)


class Embed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        nn.init.normal_(self.tok_emb.weight, std=0.02)

    def forward(self, tokens):
        return self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))


class TPBlock(nn.Module):
    """A Block built whole (same init as the reference), then split over the TP group."""

    def __init__(self, cfg, group=None):
        super().__init__()
        self.block = Block(cfg)
        if group is not None:
            from dslaunch.engine.parallel.tp_plan import apply_tp_plan
            from gpt_tp import BLOCK_TP_PLAN
            apply_tp_plan(self.block, BLOCK_TP_PLAN, group)

    def forward(self, x):
        return self.block(x)


class FinalNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, x):
        return self.ln_f(x)


class Head(nn.Module):
    """Linear head; with ``group`` its vocabulary is split (logits stay split, for the
    vocab-parallel cross-entropy)."""

    def __init__(self, cfg, group=None):
        super().__init__()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)
        if group is not None:
            from dslaunch.engine.parallel.tensor_parallel import ColumnParallelLinear
            self.head = ColumnParallelLinear.from_linear(self.head, group, gather_output=False)

    def forward(self, x):
        return self.head(x)


def tied_logits(embed, x):
    return x @ embed.tok_emb.weight.t()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def layer_list(cfg=CFG, tied=False, tp_group=None, n_blocks=None, vocab_group=None):
    """[(kind, cls, args, kwargs)]; kind: 'layer' or ('tied', key, forward_fn). ``tp_group``
    splits the Blocks, ``vocab_group`` the head's vocabulary."""
    n = cfg.n_layer if n_blocks is None else n_blocks
    specs = [(("tied", "embed", None) if tied else "layer", Embed, (cfg,), {})]
    specs += [("layer", TPBlock, (cfg, tp_group), {}) for _ in range(n)]
    specs.append(("layer", FinalNorm, (cfg,), {}))
    if tied:
        specs.append((("tied", "embed", tied_logits), Embed, (cfg,), {}))
    else:
        specs.append(("layer", Head, (cfg, vocab_group), {}))
    return specs


def reference_model(specs, base_seed):
    """Build the layers in order, seeding base_seed + index (PipelineModule's seed_layers), one
    shared module per tied key; returns forward(tokens) -> logits and the parameters."""
    mods, tied, funcs = nn.ModuleList(), {}, []
    for idx, (kind, cls, args, kwargs) in enumerate(specs):
        if kind == "layer":
            torch.manual_seed(base_seed + idx)
            m = cls(*args, **kwargs)
            mods.append(m)
            funcs.append(m)
        else:
            _, key, fn = kind
            if key not in tied:
                torch.manual_seed(base_seed + idx)
                tied[key] = cls(*args, **kwargs)
                mods.append(tied[key])
            m = tied[key]
            funcs.append((lambda x, m=m, fn=fn: fn(m, x)) if fn else m)

    def forward(x):
        for f in funcs:
            x = f(x)
        return x
    return forward, mods


def pipe_specs(specs):
    from dslaunch.pipe import LayerSpec, TiedLayerSpec

    out = []
    for kind, cls, args, kwargs in specs:
        if kind == "layer":
            out.append(LayerSpec(cls, *args, **kwargs))
        else:
            _, key, fn = kind
            out.append(TiedLayerSpec(key, cls, *args, forward_fn=fn,
                                     tied_weight_attr="tok_emb.weight", **kwargs))
    return out
