"""DeepSpeed's sparse-attention modules over ``block_attention.py``: ``SparseSelfAttention``
(q, k, v in, the attention context out, computed on the layout's kept blocks only),
``BertSparseSelfAttention`` (a BERT self-attention layer with it) and ``sparsity_config_from_dict``
(the config's ``sparse_attention`` section -> a layout object).

Differences from DeepSpeed 0.18: runs on the CPU (and on any torch device) without Triton;
fp32, bf16 and fp16 inputs (DeepSpeed: fp16 only); each module keeps its own per-length cache
(DeepSpeed shares one across all instances, keyed by length only).
"""

from __future__ import annotations

import torch
from torch import nn

from dslaunch.engine.features.sparse_attention.block_attention import BlockTable, block_sparse_attention
from dslaunch.engine.features.sparse_attention.layouts import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)

# DeepSpeed's default arguments (the base class has no pattern: name a layout)
DEFAULT_SPARSITY_CONFIG = SparsityConfig(num_heads=4)
DEFAULT_BERT_SPARSITY_CONFIG = FixedSparsityConfig(num_heads=4)


class SparseSelfAttention(nn.Module):
    """Block-sparse self-attention (Sparse Transformers, Child et al. 2019).

    ``sparsity_config`` gives the layout, built once for ``max_seq_length`` tokens (the
    ``master_layout`` buffer; a shorter input uses its top-left corner). In a distributed job
    rank 0's layout is broadcast on the first forward, so random layouts agree across ranks.
    ``forward(query, key, value, rpe=None, key_padding_mask=None, attn_mask=None)``: q, k, v
    ``[batch, heads, seq, head_dim]`` (key may be given transposed, ``[batch, heads, head_dim,
    seq]``), seq a multiple of the block; ``key_padding_mask`` [batch, seq] (added, or with
    ``key_padding_mask_mode="mul"`` its zeros masked), ``attn_mask`` [seq, seq] (its zeros
    masked, or added with ``attn_mask_mode="add"``), ``rpe`` [batch, heads, seq, seq] added.
    Scores are scaled by head_dim ** -0.5.
    """

    def __init__(self, sparsity_config=DEFAULT_SPARSITY_CONFIG, key_padding_mask_mode="add",
                 attn_mask_mode="mul", max_seq_length=2048):
        super().__init__()
        self.sparsity_config = sparsity_config
        self.register_buffer("master_layout", sparsity_config.make_layout(max_seq_length))
        self._need_layout_synchronization = True
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self._tables = {}

    def get_layout(self, L):
        if self._need_layout_synchronization and torch.distributed.is_initialized():
            torch.distributed.broadcast(self.master_layout, src=0)
            self._need_layout_synchronization = False
            self._tables.clear()
        block = self.sparsity_config.block
        if L % block != 0:
            raise ValueError(f"sequence length {L} is not a multiple of the block size {block}")
        num_blocks = L // block
        if num_blocks > self.master_layout.shape[-1]:
            raise ValueError(f"sequence length {L} is longer than max_seq_length "
                             f"{self.master_layout.shape[-1] * block} this module was built for")
        return self.master_layout[..., :num_blocks, :num_blocks].cpu()

    def _table(self, L, device):
        if self._need_layout_synchronization and torch.distributed.is_initialized():
            self.get_layout(L)
        key = (L, str(device))
        if key not in self._tables:
            self._tables[key] = BlockTable(self.get_layout(L), self.sparsity_config.block).to(device)
        return self._tables[key]

    @staticmethod
    def transpose_key_for_scores(x, L):
        return x.permute(0, 1, 3, 2) if x.size(2) != L else x

    @staticmethod
    def transpose_mask_for_sparse(qtype, x, is_key_padding_mask=False):
        x = x.type(qtype)
        if is_key_padding_mask:  # [batch, 1, ..., seq] -> [batch, seq]
            for d in range(x.dim() - 1, 0, -1):
                x = x.squeeze(dim=d)
            return x
        return x.squeeze()

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        bsz, num_heads, tgt_len, head_dim = query.size()
        key = self.transpose_key_for_scores(key, tgt_len)
        if query.shape != key.shape or key.shape != value.shape:
            raise NotImplementedError("only self-attention is supported: query, key and value "
                                      f"must have one shape (got {tuple(query.shape)}, "
                                      f"{tuple(key.shape)}, {tuple(value.shape)})")
        if key_padding_mask is not None:
            key_padding_mask = self.transpose_mask_for_sparse(query.dtype, key_padding_mask, True)
        if attn_mask is not None:
            attn_mask = self.transpose_mask_for_sparse(query.dtype, attn_mask)
        table = self._table(tgt_len, query.device)
        return block_sparse_attention(query, key, value, table, self.sparsity_config.block,
                                      float(head_dim) ** -0.5, rpe=rpe,
                                      key_padding_mask=key_padding_mask,
                                      key_padding_mask_mode=self.key_padding_mask_mode,
                                      attn_mask=attn_mask, attn_mask_mode=self.attn_mask_mode)


class BertSparseSelfAttention(nn.Module):
    """BERT's self-attention with ``SparseSelfAttention`` inside: ``config`` has
    ``hidden_size`` and ``num_attention_heads``; ``forward(hidden_states, attention_mask)``
    [batch, seq, hidden] -> [batch, seq, hidden], ``attention_mask`` the additive
    [batch, 1, 1, seq] (or [batch, seq]) key-padding mask."""

    def __init__(self, config, sparsity_config=DEFAULT_BERT_SPARSITY_CONFIG):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(f"hidden size {config.hidden_size} is not a multiple of the "
                             f"{config.num_attention_heads} attention heads")
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        self.sparse_self_attention = SparseSelfAttention(sparsity_config)

    def transpose_for_scores(self, x):
        x = x.view(*x.size()[:-1], self.num_attention_heads, self.attention_head_size)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        context = self.sparse_self_attention(q, k, v, key_padding_mask=attention_mask)
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(*context.size()[:-2], self.all_head_size)


_MODES = {
    "dense": (DenseSparsityConfig, ("block",)),
    "fixed": (FixedSparsityConfig, ("block", "different_layout_per_head", "num_local_blocks",
                                    "num_global_blocks", "attention",
                                    "horizontal_global_attention",
                                    "num_different_global_patterns")),
    "variable": (VariableSparsityConfig, ("block", "different_layout_per_head",
                                          "num_random_blocks", "local_window_blocks",
                                          "global_block_indices", "global_block_end_indices",
                                          "attention", "horizontal_global_attention")),
    "bigbird": (BigBirdSparsityConfig, ("block", "different_layout_per_head",
                                        "num_random_blocks", "num_sliding_window_blocks",
                                        "num_global_blocks", "attention")),
    "bslongformer": (BSLongformerSparsityConfig, ("block", "different_layout_per_head",
                                                  "num_sliding_window_blocks",
                                                  "global_block_indices",
                                                  "global_block_end_indices", "attention")),
    "local": (LocalSlidingWindowSparsityConfig, ("block", "num_sliding_window_blocks",
                                                 "attention")),
}

# DeepSpeed 0.18's defaults per key where the section leaves it out (its runtime/config.py); a
# mode takes only its own keys, as DeepSpeed's get_sparse_*_config do
SECTION_DEFAULTS = {
    "mode": "fixed", "block": 16, "different_layout_per_head": False, "num_local_blocks": 4,
    "num_global_blocks": 1, "attention": "bidirectional", "horizontal_global_attention": False,
    "num_different_global_patterns": 1, "num_random_blocks": 0, "local_window_blocks": [4],
    "global_block_indices": [0], "global_block_end_indices": None,
    "num_sliding_window_blocks": 3,
}


def sparsity_config_from_dict(section: dict, num_heads: int) -> SparsityConfig:
    """The config's ``sparse_attention`` section -> its layout object for ``num_heads`` heads
    (``mode``: dense, fixed, variable, bigbird, bslongformer; and ``local``, dslaunch's name for
    LocalSlidingWindowSparsityConfig, which DeepSpeed's config cannot select)."""
    values = {**SECTION_DEFAULTS, **{k: v for k, v in (section or {}).items() if v is not None
                                     or k == "global_block_end_indices"}}
    mode = values["mode"]
    if mode not in _MODES:
        raise NotImplementedError(f"sparse_attention.mode {mode!r}: one of {', '.join(_MODES)}")
    cls, keys = _MODES[mode]
    kwargs = {k: values[k] for k in keys}
    if mode == "local" and section.get("attention") is None:
        kwargs["attention"] = "unidirectional"  # the class's own default
    return cls(num_heads, **kwargs)
