"""Tensor-level entry points of the CUDA ops (load_op names cuda_fused_adam, cuda_onebit,
cuda_bf16). Each returns False when the op is unavailable so the caller runs its torch path.

    fused_adam(params, grads, exp_avgs, exp_avg_sqs, step=, lr=, ..., copies=None) -> bool
    onebit_pack(x, error, block) -> (bits uint8 [n/8], scales fp32 [ceil(n/block)]) | None
    onebit_unpack(bits, scales, out, block, alpha=1.0, accumulate=False) -> bool
    to_bf16(x_fp32) -> bf16 tensor | None ;  to_f32(x_bf16) -> fp32 tensor | None

All tensors: contiguous, on the current CUDA device; kernels run on the current stream. The bit
layout is dslaunch/engine/optim/onebit/compressed.py's (element 8i+k in bit k of byte i; scale = l2 norm
of the block / sqrt(its size)).
"""

from __future__ import annotations

import torch

from dslaunch.kernels import load_op

_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _check(*tensors):
    for t in tensors:
        if not (t.is_cuda and t.is_contiguous()):
            raise ValueError("CUDA ops need contiguous CUDA tensors")


def fused_adam(params, grads, exp_avgs, exp_avg_sqs, *, step, lr, beta1=0.9, beta2=0.999,
               eps=1e-8, weight_decay=0.0, adamw=False, bias_correction=True, grad_scale=1.0,
               copies=None) -> bool:
    op = load_op("cuda_fused_adam")
    if op is None or not params:
        return False
    copies = copies if copies is not None else [None] * len(params)
    pdt, gdt = _CODES[params[0].dtype], _CODES[grads[0].dtype]
    cdt = -1 if copies[0] is None else _CODES[copies[0].dtype]
    rows = []
    for p, g, m, v, c in zip(params, grads, exp_avgs, exp_avg_sqs, copies):
        _check(p, g, m, v, *([c] if c is not None else []))
        if _CODES[p.dtype] != pdt or _CODES[g.dtype] != gdt or (c is None) != (cdt == -1) or (
                m.dtype != torch.float32 or v.dtype != torch.float32):
            raise ValueError("fused_adam: one dtype per role within a call; fp32 states")
        if c is not None and _CODES[c.dtype] != cdt:
            raise ValueError("fused_adam: one copy dtype per call")
        n = p.numel()
        if not (g.numel() == m.numel() == v.numel() == n and (c is None or c.numel() == n)):
            raise ValueError("fused_adam: sizes differ")
        rows.append((p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(),
                     0 if c is None else c.data_ptr(), n))
    op.adam(rows, pdt, gdt, cdt, lr, beta1, beta2, eps, weight_decay, step, adamw,
            bias_correction, grad_scale, _stream())
    return True


def onebit_pack(x, error, block: int = 2048):
    op = load_op("cuda_onebit")
    if op is None:
        return None
    _check(x, error)
    n = x.numel()
    if n % 8 or block % 8 or x.dtype != torch.float32 or error.dtype != torch.float32:
        raise ValueError("onebit_pack: fp32, numel and block multiples of 8")
    bits = torch.empty(n // 8, dtype=torch.uint8, device=x.device)
    scales = torch.empty(-(-n // block), dtype=torch.float32, device=x.device)
    op.pack(x.data_ptr(), error.data_ptr(), bits.data_ptr(), scales.data_ptr(), n, block, _stream())
    return bits, scales


def onebit_unpack(bits, scales, out, block: int = 2048, alpha: float = 1.0,
                  accumulate: bool = False) -> bool:
    op = load_op("cuda_onebit")
    if op is None:
        return False
    _check(bits, scales, out)
    op.unpack(bits.data_ptr(), scales.data_ptr(), out.data_ptr(), out.numel(), block, alpha,
              accumulate, _stream())
    return True


def to_bf16(x):
    op = load_op("cuda_bf16")
    if op is None:
        return None
    _check(x)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    op.to_bf16(x.data_ptr(), out.data_ptr(), x.numel(), _stream())
    return out


def to_f32(x):
    op = load_op("cuda_bf16")
    if op is None:
        return None
    _check(x)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    op.to_f32(x.data_ptr(), out.data_ptr(), x.numel(), _stream())
    return out
