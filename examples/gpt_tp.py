"""examples/gpt.py's tensor-parallel plan: which of its modules are split over the ``model``
group, and how (dslaunch.engine.parallel.tp_plan.apply_tp_plan applies it)::

    apply_tp_plan(Block(cfg), BLOCK_TP_PLAN, group)   # one pipeline layer
    apply_tp_plan(GPT(cfg), GPT_TP_PLAN, group)       # the whole model

Megatron's layout: in each half of a Block a column-parallel layer (output split) feeds a
row-parallel one (input split), so each half costs one all-reduce forward and one backward.
gpt.py stays plain PyTorch for the DDP/FSDP/DeepSpeed peers; the only TP-aware code of the
example is the attention below, which runs on this rank's share of the heads.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dslaunch.engine.parallel.tensor_parallel import get_rng_tracker


class HeadParallelAttention(nn.Module):
    """gpt.CausalSelfAttention on ``n_head / tp`` heads: ``qkv`` (split by the plan) yields this
    rank's q, k and v features, ``proj`` (row-parallel) sums every rank's heads. Attention
    dropout draws from the per-TP-rank stream (``tp_manual_seed``), so ranks drop independently
    on their heads. Built from the full attention, keeping its ``qkv``/``proj`` (and names)."""

    def __init__(self, attn: nn.Module, group):
        super().__init__()
        tp = dist.get_world_size(group)
        if attn.n_head % tp:
            raise ValueError(f"tensor parallel: {attn.n_head} heads do not split over {tp} ranks")
        self.n_head = attn.n_head // tp
        self.local = attn.qkv.in_features // tp  # this rank's width of each of q, k, v
        self.dropout = attn.dropout
        self.qkv, self.proj = attn.qkv, attn.proj

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.local, dim=2)
        q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        tracker = get_rng_tracker()
        ctx = tracker.fork() if p > 0 and "tensor-parallel" in tracker.states \
            else contextlib.nullcontext()
        with ctx:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.local))


# module name in a gpt.Block -> parallel style (dslaunch.engine.parallel.tp_plan.STYLES, or a callable)
BLOCK_TP_PLAN = {
    "attn": HeadParallelAttention,  # first (parents before children), then its two linears:
    "attn.qkv": "column_fused3",  # [q; k; v]: this rank's heads of each
    "attn.proj": "row",
    "mlp.fc": "column",
    "mlp.proj": "row",  # gpt.MLP's own forward runs unchanged on the split fc
}

# module name in a gpt.GPT -> parallel style: every Block as above, plus the vocabulary
GPT_TP_PLAN = {
    "tok_emb": "vocab",
    "blocks.*.attn": HeadParallelAttention,
    "blocks.*.attn.qkv": "column_fused3",
    "blocks.*.attn.proj": "row",
    "blocks.*.mlp.fc": "column",
    "blocks.*.mlp.proj": "row",
    "head": "column_gather",  # logits gathered, so GPT.forward's own loss still works
}
