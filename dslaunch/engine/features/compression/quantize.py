"""The value maps of compression training (DeepSpeed 0.18's ``compression/utils.py`` semantics),
each with a straight-through gradient:

- symmetric, ``b`` bits, per group: ``s = 2 max|x| / 2^b``; ``x -> clamp(round(x/s), -2^(b-1),
  2^(b-1) - 1) * s`` (at most ``2^b`` values per group);
- asymmetric: ``s = (max - min) / 2^b``, ``z = round(min/s) s``; ``x -> clamp(round((x-z)/s), 0,
  2^b - 1) s + z``;
- ternary (2 bits): ``t = 0.7 mean|x|``, ``a`` = mean ``|x|`` over ``|x| > t``; ``x -> a sign(x)``
  where ``|x| > t``, else 0;
- binary (1 bit): ``x -> mean|x| sign(x)`` per group;
- ``topk_mask(scores, ratio)``: 1 on the ``ceil(ratio n)`` largest scores, 0 elsewhere (ties by a
  stable descending sort, as DeepSpeed's).

``stochastic=True`` rounds up with probability the fraction (MoQ's stochastic rounding).
"""

from __future__ import annotations

import math

import torch


def _round(x: torch.Tensor, stochastic: bool) -> torch.Tensor:
    if stochastic:
        return torch.floor(x + torch.rand_like(x))
    return x.round()


def _ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q`` forward (exactly: ``x - x.detach()`` is 0), the identity's gradient backward."""
    return q.detach() + (x - x.detach())


def quantize(x: torch.Tensor, bits: int, groups: int = 1, kind: str = "symmetric",
             stochastic: bool = False) -> torch.Tensor:
    """``x`` quantized to ``bits`` per group of ``x.numel() // groups`` consecutive values."""
    flat = x.detach().reshape(groups, -1)
    if bits >= 3 or kind == "asymmetric":
        levels = 2 ** bits
        if kind == "symmetric":
            scale = 2 * flat.abs().amax(dim=-1, keepdim=True) / levels
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
            q = _round(flat / scale, stochastic).clamp(-levels // 2, levels // 2 - 1) * scale
        else:
            low = flat.amin(dim=-1, keepdim=True)
            high = flat.amax(dim=-1, keepdim=True)
            scale = (high - low) / levels
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
            zero = (low / scale).round() * scale
            q = _round((flat - zero) / scale, stochastic).clamp(0, levels - 1) * scale + zero
    elif bits == 2:
        n = flat.shape[1]
        threshold = 0.7 * flat.abs().sum(dim=1, keepdim=True) / n
        keep = (flat.abs() > threshold).to(flat.dtype)
        alpha = (keep * flat).abs().sum(dim=1, keepdim=True) / keep.sum(dim=1, keepdim=True)
        q = alpha * ((flat > threshold).to(flat.dtype) - (flat < -threshold).to(flat.dtype))
    else:
        q = flat.sign() * flat.norm(p=1, dim=1, keepdim=True).div(flat.shape[1])
    return _ste(x, q.reshape(x.shape).to(x.dtype))


def quantize_range(x: torch.Tensor, bits: int, low: torch.Tensor, high: torch.Tensor,
                   kind: str = "symmetric") -> torch.Tensor:
    """``x`` quantized over a given range (static activation quantization): symmetric over
    ``max(|low|, high)``, asymmetric over ``[low, high]``; straight-through gradient."""
    levels = 2 ** bits
    flat = x.detach()
    if kind == "symmetric":
        scale = 2 * torch.maximum(low.abs(), high) / levels
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = (flat / scale).round().clamp(-levels // 2, levels // 2 - 1) * scale
    else:
        scale = (high - low) / levels
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero = (low / scale).round() * scale
        q = ((flat - zero) / scale).round().clamp(0, levels - 1) * scale + zero
    return _ste(x, q.to(x.dtype))


def topk_mask(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """1 on the ``ceil(ratio * n)`` largest entries of ``scores``; gradient straight through."""
    flat = scores.detach().flatten()
    keep = math.ceil(ratio * flat.numel())
    order = flat.sort(descending=True, stable=True).indices
    mask = torch.zeros_like(flat)
    mask[order[:keep]] = 1.0
    return _ste(scores, mask.view(scores.shape))
