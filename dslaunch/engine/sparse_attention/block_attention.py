"""Block-sparse attention on the CPU (or any torch device): scores, softmax and the weighted sum
are computed only on the blocks a layout keeps.

``block_sparse_attention(q, k, v, layout, block, scale, ...)`` with q, k, v ``[batch, heads,
seq, head_dim]`` and ``layout`` ``[heads, seq/block, seq/block]`` (0/1) returns what dense
attention returns when every token pair outside a kept block is masked out: per query row, a
softmax over the keys of the row's kept blocks. The masks follow DeepSpeed's sparse softmax:
scores are scaled, then ``rpe`` ([batch or 1, heads, seq, seq]) is added, then the key-padding
mask ([batch, seq]) and the attention mask ([seq, seq]) are added (mode ``"add"``) or turn their
zeros into -inf (mode ``"mul"``). A row with no key left gives zeros (dense softmax gives NaN).

How: per head and block row, the kept column blocks are listed (padded to the longest row, the
padding masked). Row blocks are processed in chunks; for a chunk the kept key/value blocks are
gathered and two batched matmuls give the chunk's [block, kept*block] scores and its output.
Only q, k, v, the output and one log-sum-exp per row are kept for backward, which recomputes
each chunk's probabilities (as flash attention does), so memory grows with the kept blocks of
one chunk, never with seq^2. Arithmetic is fp32 whatever the input dtype (bf16/fp16 inputs are
upcast per chunk; the output has the input's dtype). Gradients flow to q, k and v (not to the
masks or rpe, as in DeepSpeed).
"""

from __future__ import annotations

from typing import Optional

import torch

# score elements (batch * heads * rows * kept columns) per chunk: ~64 MB of fp32 scores
CHUNK_ELEMENTS = 1 << 24


class BlockTable:
    """A layout as per-(head, block row) lists of kept column blocks.

    ``cols`` [heads, rows, width] int64 (ascending, padded with column 0), ``valid`` the same
    shape, bool; ``width`` the most blocks any row keeps.
    """

    def __init__(self, layout: torch.Tensor):
        if layout.dim() != 3 or layout.shape[1] != layout.shape[2]:
            raise ValueError(f"layout must be [heads, blocks, blocks], got {tuple(layout.shape)}")
        keep = layout.to(torch.bool).cpu()
        counts = keep.sum(-1)
        self.width = max(int(counts.max()), 1)
        order = torch.sort(keep.to(torch.int8), dim=-1, descending=True, stable=True).indices
        cols = order[..., :self.width].clone()
        valid = torch.arange(self.width) < counts.unsqueeze(-1)
        cols[~valid] = 0
        self.cols, self.valid = cols, valid
        self.heads, self.rows = keep.shape[0], keep.shape[1]
        self.density = float(keep.float().mean())

    def to(self, device):
        self.cols, self.valid = self.cols.to(device), self.valid.to(device)
        return self


def _chunk_rows(batch: int, heads: int, block: int, width: int, rows: int) -> int:
    per_row = batch * heads * block * width * block
    return max(1, min(rows, CHUNK_ELEMENTS // max(per_row, 1)))


def _neg_inf_where_zero(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(mask, dtype=torch.float32).masked_fill(mask == 0, float("-inf"))


class _Masks:
    """The additive terms of one chunk's scores [B, H, rows, block, width*block], gathered from
    the given rpe / key-padding / attention masks."""

    def __init__(self, block, rpe, key_padding_mask, kp_mode, attn_mask, attn_mode):
        self.block = block
        self.rpe = rpe
        self.kpm = None
        if key_padding_mask is not None:
            kpm = key_padding_mask.float()
            self.kpm = _neg_inf_where_zero(kpm) if kp_mode == "mul" else kpm
        self.am = None
        if attn_mask is not None:
            am = attn_mask.float()
            self.am = _neg_inf_where_zero(am) if attn_mode == "mul" else am

    def add(self, scores, rows, cols, head_index):
        """scores [B, H, R, bs, W*bs]; rows [R] block-row ids; cols [H, R, W]."""
        b = self.block
        B, H, R = scores.shape[0], scores.shape[1], scores.shape[2]
        W = cols.shape[-1]
        if self.rpe is not None:
            rpe = self.rpe
            n = rpe.shape[-1] // b
            blocks = rpe.reshape(rpe.shape[0], rpe.shape[1], n, b, n, b).permute(0, 1, 2, 4, 3, 5)
            picked = blocks[:, head_index, rows.view(1, R, 1), cols]  # [Br, H, R, W, bs, bs]
            scores = scores + picked.permute(0, 1, 2, 4, 3, 5).reshape(-1, H, R, b, W * b).float()
        if self.kpm is not None:
            n = self.kpm.shape[-1] // b
            picked = self.kpm.reshape(B, n, b)[:, cols]  # [B, H, R, W, bs]
            scores = scores + picked.reshape(B, H, R, 1, W * b)
        if self.am is not None:
            n = self.am.shape[-1] // b
            blocks = self.am.reshape(n, b, n, b).permute(0, 2, 1, 3)
            picked = blocks[rows.view(1, R, 1), cols]  # [H, R, W, bs, bs]
            scores = scores + picked.permute(0, 1, 3, 2, 4).reshape(1, H, R, b, W * b)
        return scores


def _gather(blocks, head_index, cols):
    """blocks [B, H, n, bs, D] -> the kept blocks [B, H, R, W*bs, D] (fp32)."""
    B, H, _, b, D = blocks.shape
    R, W = cols.shape[1], cols.shape[2]
    return blocks[:, head_index, cols].reshape(B, H, R, W * b, D).float()


def _chunk_scores(qc, kg, scale, masks, rows, cols, valid, head_index, block):
    scores = torch.matmul(qc, kg.transpose(-1, -2)) * scale  # [B, H, R, bs, W*bs]
    scores = masks.add(scores, rows, cols, head_index)
    W = cols.shape[-1]
    pad = ~valid.repeat_interleave(block, dim=-1)  # [H, R, W*bs]
    return scores.masked_fill(pad.unsqueeze(0).unsqueeze(3), float("-inf")), W


class _BlockSparseAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, table, block, scale, masks):
        B, H, L, D = q.shape
        n = L // block
        qb, kb, vb = (t.reshape(B, H, n, block, D) for t in (q, k, v))
        head_index = torch.arange(H, device=q.device).view(H, 1, 1)
        out = torch.empty(B, H, n, block, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, n, block, dtype=torch.float32, device=q.device)
        step = _chunk_rows(B, H, block, table.width, n)
        for r0 in range(0, n, step):
            r1 = min(r0 + step, n)
            rows = torch.arange(r0, r1, device=q.device)
            cols, valid = table.cols[:, r0:r1], table.valid[:, r0:r1]
            kg = _gather(kb, head_index, cols)
            vg = _gather(vb, head_index, cols)
            qc = qb[:, :, r0:r1].float()
            scores, _ = _chunk_scores(qc, kg, scale, masks, rows, cols, valid, head_index, block)
            m = scores.amax(-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            e = torch.exp(scores - m)
            total = e.sum(-1, keepdim=True)
            p = e / total.clamp_min(torch.finfo(torch.float32).tiny)
            out[:, :, r0:r1] = torch.matmul(p, vg)
            lse[:, :, r0:r1] = torch.where(total > 0, m + torch.log(total),
                                          torch.full_like(m, float("inf"))).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.table, ctx.block, ctx.scale, ctx.masks = table, block, scale, masks
        return out.reshape(B, H, L, D).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        table, block, scale, masks = ctx.table, ctx.block, ctx.scale, ctx.masks
        B, H, L, D = q.shape
        n = L // block
        qb, kb, vb = (t.reshape(B, H, n, block, D) for t in (q, k, v))
        gob = grad_out.reshape(B, H, n, block, D).float()
        head_index = torch.arange(H, device=q.device).view(H, 1, 1)
        dq = torch.zeros(B, H, n, block, D, dtype=torch.float32, device=q.device)
        dk = torch.zeros(B, H * n, block, D, dtype=torch.float32, device=q.device)
        dv = torch.zeros(B, H * n, block, D, dtype=torch.float32, device=q.device)
        delta = (gob * out).sum(-1, keepdim=True)  # [B, H, n, bs, 1]
        step = _chunk_rows(B, H, block, table.width, n)
        for r0 in range(0, n, step):
            r1 = min(r0 + step, n)
            rows = torch.arange(r0, r1, device=q.device)
            cols, valid = table.cols[:, r0:r1], table.valid[:, r0:r1]
            R, W = cols.shape[1], cols.shape[2]
            kg = _gather(kb, head_index, cols)
            vg = _gather(vb, head_index, cols)
            qc = qb[:, :, r0:r1].float()
            scores, _ = _chunk_scores(qc, kg, scale, masks, rows, cols, valid, head_index, block)
            p = torch.exp(scores - lse[:, :, r0:r1].unsqueeze(-1))  # [B, H, R, bs, W*bs]
            go = gob[:, :, r0:r1]
            dp = torch.matmul(go, vg.transpose(-1, -2))
            ds = p * (dp - delta[:, :, r0:r1]) * scale
            dq[:, :, r0:r1] = torch.matmul(ds, kg)
            flat = (head_index * n + cols).reshape(-1)  # [H*R*W] rows of dk / dv
            dk.index_add_(1, flat, torch.matmul(ds.transpose(-1, -2), qc)
                          .reshape(B, H * R * W, block, D))
            dv.index_add_(1, flat, torch.matmul(p.transpose(-1, -2), go)
                          .reshape(B, H * R * W, block, D))
        shape = (B, H, L, D)
        return (dq.reshape(shape).to(q.dtype), dk.reshape(shape).to(k.dtype),
                dv.reshape(shape).to(v.dtype), None, None, None, None)


def block_sparse_attention(q, k, v, layout_or_table, block: int, scale: Optional[float] = None,
                           rpe=None, key_padding_mask=None, key_padding_mask_mode="add",
                           attn_mask=None, attn_mask_mode="mul"):
    """softmax(scale * q k^T + masks) v over the kept blocks only; q, k, v [B, H, L, D]."""
    B, H, L, D = q.shape
    if L % block:
        raise ValueError(f"sequence length {L} is not a multiple of the block size {block}")
    table = (layout_or_table if isinstance(layout_or_table, BlockTable)
             else BlockTable(layout_or_table))
    if table.rows != L // block:
        raise ValueError(f"the layout has {table.rows} block rows; {L} tokens make {L // block}")
    if table.heads != H:
        raise ValueError(f"the layout has {table.heads} heads; q has {H}")
    if table.cols.device != q.device:
        table.to(q.device)
    for mode, name in ((key_padding_mask_mode, "key_padding_mask_mode"),
                       (attn_mask_mode, "attn_mask_mode")):
        if mode not in ("add", "mul"):
            raise ValueError(f"{name} {mode!r}: 'add' or 'mul'")
    scale = float(D) ** -0.5 if scale is None else float(scale)
    masks = _Masks(block, rpe, key_padding_mask, key_padding_mask_mode, attn_mask, attn_mask_mode)
    return _BlockSparseAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), table,
                                       block, scale, masks)


def layout_to_token_mask(layout: torch.Tensor, block: int) -> torch.Tensor:
    """The layout expanded to tokens: [heads, seq, seq] bool (for dense references)."""
    return layout.to(torch.bool).repeat_interleave(block, 1).repeat_interleave(block, 2)
