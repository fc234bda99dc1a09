"""Ulysses sequence parallelism: DeepSpeed's ``DistributedAttention``.

Each of the ``P`` ranks of a sequence-parallel group holds ``1/P`` of the sequence of q, k and v
with every head. One all-to-all per tensor turns that into the whole sequence for ``1/P`` of the
heads; the local attention (any function of q, k, v: softmax attention needs every key of a
query's row, which the rank now has) runs on those heads; one all-to-all turns the result back
into the rank's sequence shard with every head. Autograd goes through both exchanges: the adjoint
of an all-to-all that scatters dim ``a`` and gathers dim ``b`` is the one that scatters ``b`` and
gathers ``a``.

Layouts as DeepSpeed 0.19: ``[b, s, h, d]`` (``batch_dim_idx=0``) or ``[s, b, h, d]``
(``batch_dim_idx=1``); heads are dim 2. GQA/MQA: k and v may carry fewer heads than q; each
tensor's heads are split in P contiguous blocks, so query block ``r`` lands with key/value block
``r``, which is the block its grouped heads attend to. Head counts the group size does not divide
are refused with an error naming the count (DeepSpeed pads ranks unevenly instead).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dslaunch.engine.comm.api import all_to_all_single

HEAD_DIM = 2


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` in ``P`` blocks along ``scatter_dim``, send block ``j`` to rank ``j`` of
    ``group``, and concatenate what arrives along ``gather_dim`` in rank order."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    n = x.shape[scatter_dim]
    if n % world:
        raise ValueError(f"sequence parallel: dim {scatter_dim} of size {n} does not split over "
                         f"{world} ranks")
    shape = list(x.shape)
    # blocks first: [P, ...x with scatter_dim / P...], contiguous for the collective
    blocks = x.reshape(shape[:scatter_dim] + [world, n // world] + shape[scatter_dim + 1:])
    blocks = blocks.movedim(scatter_dim, 0).contiguous()
    received = torch.empty_like(blocks)
    all_to_all_single(received, blocks, group=group)
    # received[j] is rank j's block: put the rank axis just before gather_dim and merge them
    out = received.movedim(0, gather_dim)
    merged = list(out.shape)
    merged[gather_dim:gather_dim + 2] = [merged[gather_dim] * merged[gather_dim + 1]]
    return out.reshape(merged)


class UlyssesAllToAll(torch.autograd.Function):
    """The differentiable exchange; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return UlyssesAllToAll.apply(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_all_to_all(x: torch.Tensor, scatter_idx: int, gather_idx: int, batch_dim_idx: int,
                   group) -> torch.Tensor:
    """DeepSpeed's reading of ``scatter_idx``: 2 or more scatters the heads and gathers the
    sequence; below 2 scatters the sequence and gathers the heads. Which dim is the sequence
    follows from ``batch_dim_idx`` (0: ``[b, s, h, d]``, 1: ``[s, b, h, d]``)."""
    if batch_dim_idx not in (0, 1):
        raise ValueError(f"DistributedAttention: batch_dim_idx must be 0 ([b, s, h, d]) or 1 "
                         f"([s, b, h, d]), got {batch_dim_idx}")
    seq_dim = 1 - batch_dim_idx
    if scatter_idx >= 2:
        return UlyssesAllToAll.apply(x, HEAD_DIM, seq_dim, group)
    return UlyssesAllToAll.apply(x, seq_dim, HEAD_DIM, group)


def _check_heads(name: str, heads: int, world: int) -> None:
    if heads % world:
        raise ValueError(
            f"DistributedAttention: {name} has {heads} heads, which the sequence-parallel size "
            f"{world} does not divide; use a sequence-parallel size that divides the number of "
            f"{'key/value' if name != 'query' else 'query'} heads")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first ``cos.shape[-1]`` channels of ``t`` (the rest pass)."""
    rot = cos.shape[-1]
    t, rest = t[..., :rot], t[..., rot:]
    t = t * cos + _rotate_half(t) * sin
    return t if rest.shape[-1] == 0 else torch.cat((t, rest), dim=-1)


class DistributedAttention(torch.nn.Module):
    """``DistributedAttention(local_attention, sequence_process_group, scatter_idx=2,
    gather_idx=0, sp_stream=None, num_kv_heads=None)``, DeepSpeed 0.19's signature.

    ``forward(query, key, value, batch_dim_idx, rotary_pos_emb=None, *args, **kwargs)``: q, k, v
    hold this rank's sequence shard with every head; ``local_attention(q, k, v, *args,
    **kwargs)`` sees the whole sequence with ``1/P`` of the heads, in the same layout; the result
    is this rank's sequence shard with every head. ``sp_stream`` (DeepSpeed's overlap of the q/k
    exchanges on a side CUDA stream) is accepted and not used: the exchanges run in order.
    ``num_kv_heads``: the key/value head count, checked against the group size (read from the
    key tensor when not given)."""

    def __init__(self, local_attention, sequence_process_group, scatter_idx: int = 2,
                 gather_idx: int = 0, sp_stream=None, num_kv_heads: int | None = None):
        super().__init__()
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.sp_stream = sp_stream
        self.num_kv_heads = num_kv_heads

    def forward(self, query, key, value, batch_dim_idx: int, rotary_pos_emb=None, *args,
                **kwargs):
        world = dist.get_world_size(self.spg)
        _check_heads("query", query.shape[HEAD_DIM], world)
        kv_heads = self.num_kv_heads if self.num_kv_heads is not None else key.shape[HEAD_DIM]
        _check_heads("key", kv_heads, world)
        _check_heads("value", value.shape[HEAD_DIM], world)
        if query.shape[HEAD_DIM] % key.shape[HEAD_DIM]:
            raise ValueError(f"DistributedAttention: {query.shape[HEAD_DIM]} query heads are not "
                             f"a multiple of {key.shape[HEAD_DIM]} key/value heads")

        q, k, v = (seq_all_to_all(t, self.scatter_idx, self.gather_idx, batch_dim_idx, self.spg)
                   for t in (query, key, value))
        if rotary_pos_emb is not None:  # Megatron's [s, b, 1, d] frequencies, as DeepSpeed
            cos, sin = (f.permute(1, 0, 2, 3) for f in rotary_pos_emb)
            q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return seq_all_to_all(context, self.gather_idx, self.scatter_idx, batch_dim_idx, self.spg)
