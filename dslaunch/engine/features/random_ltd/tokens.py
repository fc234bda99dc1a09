"""Choosing the tokens a random-LTD layer keeps, gathering them and putting the layer's output
back, in torch ops (any device; DeepSpeed 0.19.8 runs these through its CUDA-only
``RandomLTDBuilder`` op). Index tensors are ``[layers, batch, kept]``, sorted along ``kept`` so
that the kept tokens stay in sequence order (a causal mask cut to ``kept x kept`` is then the
causal mask of the kept tokens).
"""

from __future__ import annotations

import torch


def _sorted_samples(reserved_length: int, seq_length: int, batch_size: int, layers: int,
                    device) -> torch.Tensor:
    """``[layers, batch, reserved_length]`` int32 token positions, uniformly drawn without
    replacement per (layer, sample), ascending (the same draw as DeepSpeed's: one multinomial over
    ``layers * batch`` uniform rows)."""
    uniform = torch.ones((layers * batch_size, seq_length), device=device)
    picked = torch.multinomial(uniform, reserved_length)
    return picked.sort(dim=1).values.reshape(layers, batch_size, reserved_length).to(torch.int32)


def gpt_sample_tokens(reserved_length: int, seq_length: int, batch_size: int, layers: int = 1,
                      device="cpu", attn_mask: torch.Tensor = None):
    """Decoder models: the kept positions, and the causal ``attn_mask`` (``[batch, 1, seq,
    seq]``) cut to its top-left ``kept x kept`` block (None without a mask)."""
    indices = _sorted_samples(reserved_length, seq_length, batch_size, layers, device)
    mask = None if attn_mask is None else attn_mask[:, :, :reserved_length, :reserved_length]
    return indices, mask


def bert_sample_tokens(reserved_length: int, seq_length: int, batch_size: int, layers: int = 1,
                       device="cpu", attn_mask: torch.Tensor = None):
    """Encoder models: the kept positions, and per layer the ``attn_mask`` rows and columns of
    each sample's kept tokens (``[layers]`` of ``[batch, heads, kept, kept]``)."""
    if attn_mask is None:
        raise ValueError("random-LTD with model_type 'encoder' needs the attention mask: name "
                         "the layer's mask keyword in data_efficiency.data_routing.random_ltd."
                         "model_mask_name")
    indices = _sorted_samples(reserved_length, seq_length, batch_size, layers, device)
    long = indices.long()
    masks = []
    for layer in range(layers):
        rows = torch.stack([attn_mask[b][:, long[layer, b]] for b in range(batch_size)])
        masks.append(torch.stack([rows[b][:, :, long[layer, b]] for b in range(batch_size)]))
    return indices, masks


def _along_seq(indices: torch.Tensor, like: torch.Tensor, batch_first: bool) -> torch.Tensor:
    """``indices`` ``[batch, kept]`` expanded to index ``like`` along its sequence dimension."""
    idx = indices.long()
    if not batch_first:
        idx = idx.t()  # [kept, batch]
    return idx.unsqueeze(-1).expand(*idx.shape, like.size(-1))


def gather_tokens(hidden: torch.Tensor, indices: torch.Tensor, batch_first: bool) -> torch.Tensor:
    """The kept tokens of ``hidden`` (``[batch, seq, h]`` or ``[seq, batch, h]``)."""
    return hidden.gather(1 if batch_first else 0, _along_seq(indices, hidden, batch_first))


def scatter_tokens(hidden: torch.Tensor, kept: torch.Tensor, indices: torch.Tensor,
                   batch_first: bool) -> torch.Tensor:
    """A copy of ``hidden`` with the kept positions replaced by ``kept``."""
    return hidden.scatter(1 if batch_first else 0, _along_seq(indices, hidden, batch_first), kept)


class GatherTokens(torch.autograd.Function):
    """DeepSpeed's: ``(activations, kept tokens)``; backward writes the kept tokens' gradient over
    the activations' gradient at their positions (used with ``ScatterTokens``, whose backward
    hands the whole output gradient to the activations)."""

    @staticmethod
    def forward(ctx, activations, sorted_indices, batch_first):
        ctx.save_for_backward(sorted_indices)
        ctx.batch_first = batch_first
        return activations, gather_tokens(activations, sorted_indices, batch_first)

    @staticmethod
    def backward(ctx, a_gradients, g_gradients):
        (indices,) = ctx.saved_tensors
        return scatter_tokens(a_gradients, g_gradients, indices, ctx.batch_first), None, None


class ScatterTokens(torch.autograd.Function):
    """DeepSpeed's: ``all_activations`` with the layer's output at the kept positions."""

    @staticmethod
    def forward(ctx, all_activations, layer_activations, sorted_indices, batch_first):
        ctx.save_for_backward(sorted_indices)
        ctx.batch_first = batch_first
        return scatter_tokens(all_activations, layer_activations, sorted_indices, batch_first)

    @staticmethod
    def backward(ctx, out_gradients):
        (indices,) = ctx.saved_tensors
        kept = gather_tokens(out_gradients, indices, ctx.batch_first)
        return out_gradients, kept, None, None
