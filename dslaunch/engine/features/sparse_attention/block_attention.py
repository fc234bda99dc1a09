"""Block-sparse attention on the CPU (or any torch device): scores, softmax and the weighted sum
are computed only on the blocks a layout keeps.

``block_sparse_attention(q, k, v, layout, block, scale, ...)`` with q, k, v ``[batch, heads,
seq, head_dim]`` and ``layout`` ``[heads, seq/block, seq/block]`` (0/1) returns what dense
attention returns when every token pair outside a kept block is masked out: per query row, a
softmax over the keys of the row's kept blocks. The masks follow DeepSpeed's sparse softmax:
scores are scaled, then ``rpe`` ([batch or 1, heads, seq, seq]) is added, then the key-padding
mask ([batch, seq]) and the attention mask ([seq, seq]) are added (mode ``"add"``) or turn their
zeros into -inf (mode ``"mul"``). A row with no key left gives zeros (dense softmax gives NaN).

How (torch path): consecutive block rows that keep nearly the same column blocks form groups
(``BlockTable``); per head and group the kept column blocks are listed (padded, the padding and
the slots a row does not keep masked). Groups are processed in chunks of bounded size; for a
chunk the kept key/value blocks are gathered and two batched matmuls give the chunk's
[group tokens, kept*block] scores and its output. Only q, k, v, the output and one log-sum-exp
per row are kept for backward, which recomputes each chunk's probabilities (as flash attention
does), so memory grows with the kept blocks of one chunk, never with seq^2. On CPU tensors
without rpe (masks [B, L] / [L, L] are fine) the forward is the compiled op ``cpu_block_sparse_attn`` (one block row at
a time, online softmax over the kept blocks, OpenMP; the torch path when it cannot be built);
the backward of such a forward too, when there are at least as many (batch, head) pairs as
threads (each pair's dk and dv belong to one thread), else the torch path's. Arithmetic is
fp32 whatever the input dtype (bf16/fp16 inputs are upcast; the output has the input's dtype).
Gradients flow to q, k and v (not to the masks or rpe, as in DeepSpeed).
"""

from __future__ import annotations

from typing import Optional

import torch

# score elements (batch * heads * rows * kept columns) per chunk: ~16 MB of fp32 scores
CHUNK_ELEMENTS = 1 << 22


# rows of one group: at most this many tokens (the M of the chunk's matmuls)
GROUP_TOKENS = 256
# a group may keep at most this much more than its widest row would alone
GROUP_SLACK = 1.25


class BlockTable:
    """A layout as kept column blocks per (head, group of ``group`` consecutive block rows).

    Consecutive rows that keep (nearly) the same columns share one gather and one matmul: the
    group's columns are the union of its rows' (``cols`` [heads, groups, width], ascending,
    padded with column 0), ``keep`` [heads, groups, group, width] says which of them each row
    keeps. ``group`` is the largest power of two dividing the row count (tokens per group at
    most GROUP_TOKENS) whose widest union stays within GROUP_SLACK of the widest single row.
    """

    def __init__(self, layout: torch.Tensor, block: int = 16, group: Optional[int] = None):
        if layout.dim() != 3 or layout.shape[1] != layout.shape[2]:
            raise ValueError(f"layout must be [heads, blocks, blocks], got {tuple(layout.shape)}")
        keep = layout.to(torch.bool).cpu()
        self.heads, self.rows = keep.shape[0], keep.shape[1]
        self.density = float(keep.float().mean())
        if group is None:
            base = self._work(keep, 1)
            group = 1
            while (self.rows % (group * 2) == 0 and group * 2 * block <= GROUP_TOKENS
                   and self._work(keep, group * 2) <= GROUP_SLACK * base):
                group *= 2
        if self.rows % group:
            raise ValueError(f"group {group} does not divide the {self.rows} block rows")
        self.group = group
        union = keep.view(self.heads, self.rows // group, group, self.rows).any(2)
        counts = union.sum(-1)
        self.width = max(int(counts.max()), 1)
        order = torch.sort(union.to(torch.int8), dim=-1, descending=True, stable=True).indices
        cols = order[..., :self.width].clone()
        in_union = torch.arange(self.width) < counts.unsqueeze(-1)  # [H, groups, W]
        cols[~in_union] = 0
        rows_keep = keep.view(self.heads, self.rows // group, group, self.rows)
        picked = torch.gather(rows_keep, 3, cols.unsqueeze(2).expand(-1, -1, group, -1))
        self.cols, self.keep = cols, picked & in_union.unsqueeze(2)
        self.drop = ~self.keep
        self.group_width = counts.max(0).values.tolist()  # per group, the widest head's
        self._chunks = {}

    @staticmethod
    def _work(keep, group):
        """Score elements computed per token column when rows go in groups of ``group``."""
        heads, rows = keep.shape[0], keep.shape[1]
        union = keep.view(heads, rows // group, group, rows).any(2).sum(-1)
        return int(union.max(0).values.sum()) * group

    def chunks(self, per_slot: int):
        """(first group, end group, width) spans whose scores hold at most about CHUNK_ELEMENTS
        (``per_slot``: elements of one group x one kept slot); width: the span's widest group,
        so a few wide rows (a global row) do not widen the others."""
        key = (per_slot, CHUNK_ELEMENTS)
        if key not in self._chunks:
            spans, g0, width = [], 0, 0
            for g, w in enumerate(self.group_width):
                w = max(w, 1)
                if g > g0 and max(width, w) * (g + 1 - g0) * per_slot > CHUNK_ELEMENTS:
                    spans.append((g0, g, width))
                    g0, width = g, 0
                width = max(width, w)
            spans.append((g0, len(self.group_width), width))
            self._chunks[key] = spans
        return self._chunks[key]

    def to(self, device):
        self.cols, self.keep, self.drop = (t.to(device) for t in (self.cols, self.keep,
                                                                  self.drop))
        return self


def _neg_inf_where_zero(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(mask, dtype=torch.float32).masked_fill(mask == 0, float("-inf"))


class _Masks:
    """The additive terms of one chunk's scores [B, H, g, G*bs, W*bs] (g groups of G block
    rows), gathered from the given rpe / key-padding / attention masks."""

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
        """rows [g, G] block-row ids; cols [H, g, W]."""
        b = self.block
        B, H = scores.shape[0], scores.shape[1]
        g, G = rows.shape
        W = cols.shape[-1]
        r = rows.view(1, g, G, 1)
        c = cols.unsqueeze(2)  # [H, g, 1, W]
        if self.rpe is not None:
            rpe = self.rpe
            n = rpe.shape[-1] // b
            blocks = rpe.reshape(rpe.shape[0], rpe.shape[1], n, b, n, b).permute(0, 1, 2, 4, 3, 5)
            picked = blocks[:, head_index.view(H, 1, 1, 1), r, c]  # [Br, H, g, G, W, bs, bs]
            scores = scores + picked.permute(0, 1, 2, 3, 5, 4, 6).reshape(
                -1, H, g, G * b, W * b).float()
        if self.kpm is not None:
            n = self.kpm.shape[-1] // b
            picked = self.kpm.reshape(B, n, b)[:, cols]  # [B, H, g, W, bs]
            scores = scores + picked.reshape(B, H, g, 1, W * b)
        if self.am is not None:
            n = self.am.shape[-1] // b
            blocks = self.am.reshape(n, b, n, b).permute(0, 2, 1, 3)
            picked = blocks[r, c]  # [H, g, G, W, bs, bs]
            scores = scores + picked.permute(0, 1, 2, 4, 3, 5).reshape(1, H, g, G * b, W * b)
        return scores


def _gather(blocks, head_index, cols):
    """blocks [B, H, n, bs, D] -> the kept blocks [B, H, g, W*bs, D] (fp32)."""
    B, H, _, b, D = blocks.shape
    g, W = cols.shape[1], cols.shape[2]
    return blocks[:, head_index, cols].reshape(B, H, g, W * b, D).float()


def _chunk_scores(qs, kg, masks, rows, cols, drop, head_index, block):
    """qs: the chunk's queries already scaled; drop [H, g, G, W]: slots a row does not keep."""
    scores = torch.matmul(qs, kg.transpose(-1, -2))  # [B, H, g, G*bs, W*bs]
    scores = masks.add(scores, rows, cols, head_index)
    if not bool(drop.any()):  # every row of the chunk keeps every slot (no padding)
        return scores
    H, g, G, W = drop.shape
    drop = drop.view(H, g, G, 1, W, 1).expand(H, g, G, block, W, block)
    return scores.masked_fill_(drop.reshape(1, H, g, G * block, W * block), float("-inf"))


# the forward through the compiled CPU op (cpp/cpu/block_sparse_attn.cpp) where it applies:
# CPU tensors, no rpe, masks (if any) [B, L] / [L, L]; False: always the torch path
USE_COMPILED = True


def _compiled_op(q, masks):
    B, _, L, _ = q.shape
    if not USE_COMPILED or q.device.type != "cpu" or masks.rpe is not None or \
            (masks.kpm is not None and tuple(masks.kpm.shape) != (B, L)) or \
            (masks.am is not None and tuple(masks.am.shape) != (L, L)):
        return None
    from dslaunch.kernels import load_op

    return load_op("cpu_block_sparse_attn")


def _mask_ptrs(masks):
    kpm = None if masks.kpm is None else masks.kpm.float().contiguous()
    am = None if masks.am is None else masks.am.float().contiguous()
    return (kpm, am), (0 if kpm is None else kpm.data_ptr(), 0 if am is None else am.data_ptr())


def _compiled_forward(op, q, k, v, table, block, scale, masks):
    """out [B, H, L, D] fp32 and lse [B, H, L] from the compiled op."""
    B, H, L, D = q.shape
    qf, kf, vf = (t.detach().float().contiguous() for t in (q, k, v))
    cols = table.cols.contiguous()
    keep = table.keep.to(torch.uint8).contiguous()
    out = torch.empty(B, H, L, D, dtype=torch.float32)
    lse = torch.empty(B, H, L, dtype=torch.float32)
    _hold, (kpm, am) = _mask_ptrs(masks)  # _hold keeps the fp32 masks alive for the call
    op.forward(qf.data_ptr(), kf.data_ptr(), vf.data_ptr(), cols.data_ptr(), keep.data_ptr(),
               kpm, am, out.data_ptr(), lse.data_ptr(), B, H, L, D, block, table.group, table.width,
               scale, torch.get_num_threads())
    return out, lse


def _compiled_backward(op, q, k, v, out, lse, grad_out, table, block, scale, masks):
    B, H, L, D = q.shape
    qf, kf, vf, gf = (t.detach().float().contiguous() for t in (q, k, v, grad_out))
    cols = table.cols.contiguous()
    keep = table.keep.to(torch.uint8).contiguous()
    dq, dk, dv = (torch.zeros(B, H, L, D, dtype=torch.float32) for _ in range(3))
    _hold, (kpm, am) = _mask_ptrs(masks)  # _hold keeps the fp32 masks alive for the call
    op.backward(qf.data_ptr(), kf.data_ptr(), vf.data_ptr(), out.contiguous().data_ptr(),
                lse.contiguous().data_ptr(), gf.data_ptr(), cols.data_ptr(), keep.data_ptr(),
                kpm, am, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), B, H, L, D, block, table.group,
                table.width, scale, torch.get_num_threads())
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None)


class _BlockSparseAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, table, block, scale, masks):
        B, H, L, D = q.shape
        n = L // block
        G = table.group
        T = G * block  # tokens per group
        ng = n // G
        op = _compiled_op(q, masks)
        if op is not None:
            out, lse = _compiled_forward(op, q, k, v, table, block, scale, masks)
            ctx.save_for_backward(q, k, v, out.view(B, H, ng, T, D), lse.view(B, H, ng, T))
            ctx.table, ctx.block, ctx.scale, ctx.masks = table, block, scale, masks
            ctx.compiled = True
            return out.to(q.dtype)
        ctx.compiled = False
        qg = q.reshape(B, H, ng, T, D)
        kb, vb = (t.reshape(B, H, n, block, D) for t in (k, v))
        head_index = torch.arange(H, device=q.device).view(H, 1, 1)
        out = torch.empty(B, H, ng, T, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, ng, T, dtype=torch.float32, device=q.device)
        for g0, g1, width in table.chunks(B * H * T * block):
            rows = torch.arange(g0 * G, g1 * G, device=q.device).view(g1 - g0, G)
            cols, drop = table.cols[:, g0:g1, :width], table.drop[:, g0:g1, :, :width]
            kg = _gather(kb, head_index, cols)
            vg = _gather(vb, head_index, cols)
            qs = qg[:, :, g0:g1].float() * scale
            scores = _chunk_scores(qs, kg, masks, rows, cols, drop, head_index, block)
            m = scores.amax(-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = scores.sub_(m).exp_()  # in place: the chunk's scores become probabilities
            total = p.sum(-1, keepdim=True)
            p.div_(total.clamp_min(torch.finfo(torch.float32).tiny))
            out[:, :, g0:g1] = torch.matmul(p, vg)
            lse[:, :, g0:g1] = torch.where(total > 0, m + torch.log(total),
                                           torch.full_like(m, float("inf"))).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.table, ctx.block, ctx.scale, ctx.masks = table, block, scale, masks
        return out.reshape(B, H, L, D).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        table, block, scale, masks = ctx.table, ctx.block, ctx.scale, ctx.masks
        B, H, L, D = q.shape
        op = _compiled_op(q, masks) if ctx.compiled else None
        if op is not None and B * H >= torch.get_num_threads():  # one (batch, head) per thread
            return _compiled_backward(op, q, k, v, out, lse, grad_out, table, block, scale,
                                      masks)
        n = L // block
        G = table.group
        T = G * block
        ng = n // G
        qg = q.reshape(B, H, ng, T, D)
        kb, vb = (t.reshape(B, H, n, block, D) for t in (k, v))
        gog = grad_out.reshape(B, H, ng, T, D).float()
        head_index = torch.arange(H, device=q.device).view(H, 1, 1)
        dq = torch.zeros(B, H, ng, T, D, dtype=torch.float32, device=q.device)
        dk = torch.zeros(B, H * n, block, D, dtype=torch.float32, device=q.device)
        dv = torch.zeros(B, H * n, block, D, dtype=torch.float32, device=q.device)
        delta = (gog * out).sum(-1, keepdim=True)  # [B, H, ng, T, 1]
        for g0, g1, width in table.chunks(B * H * T * block):
            rows = torch.arange(g0 * G, g1 * G, device=q.device).view(g1 - g0, G)
            cols, drop = table.cols[:, g0:g1, :width], table.drop[:, g0:g1, :, :width]
            W = cols.shape[-1]
            kg = _gather(kb, head_index, cols)
            vg = _gather(vb, head_index, cols)
            qs = qg[:, :, g0:g1].float() * scale
            scores = _chunk_scores(qs, kg, masks, rows, cols, drop, head_index, block)
            p = scores.sub_(lse[:, :, g0:g1].unsqueeze(-1)).exp_()  # [B, H, g, T, W*bs]
            go = gog[:, :, g0:g1]
            # d(loss)/d(scores) = p * (dp - delta); scores = scale * q k^T
            ds = torch.matmul(go, vg.transpose(-1, -2)).sub_(delta[:, :, g0:g1]).mul_(p)
            dq[:, :, g0:g1] = torch.matmul(ds, kg).mul_(scale)
            flat = (head_index * n + cols).reshape(-1)  # [H*g*W] rows of dk / dv
            count = H * (g1 - g0) * W
            dk.index_add_(1, flat, torch.matmul(ds.transpose(-1, -2), qs)
                          .reshape(B, count, block, D))
            dv.index_add_(1, flat, torch.matmul(p.transpose(-1, -2), go)
                          .reshape(B, count, block, D))
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
             else BlockTable(layout_or_table, block))
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
