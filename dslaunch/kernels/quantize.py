"""Block-wise symmetric int8 / int4 quantization (ZeRO++'s qwZ and qgZ), compiled or torch.

``x`` (1-D, fp32 or bf16, ``n`` values) is cut into blocks of ``block`` values (the last may be
shorter). Per block ``scale = max|x| / qmax`` (``qmax`` = 127 for int8, 7 for int4; an fp32
division) and ``q = clamp(round_half_even(x / scale), -qmax, qmax)`` (0 in a block whose scale
is 0); dequantized, ``x' = q * scale``. So every element is within ``scale / 2`` of its value
(plus the rounding of ``x / scale`` and of ``q * scale``: a few float ulps), i.e. within
``max|block| / 254`` (int8) or ``max|block| / 14`` (int4); a block of zeros or a value that is
a multiple of its block's scale comes back exactly. Inputs must be finite.

Wire layout: int8, one byte per value; int4, two per byte (value ``2i`` in the low nibble of byte
``i``, two's complement, an odd tail's high nibble 0; ``block`` even); one fp32 scale per block.

    quantize(x, bits=8, block=2048) -> (q uint8 [qbytes(n, bits)], scales fp32 [nblocks])
    quantize_into(x, bits, block, q, scales)      (preallocated outputs, e.g. views of a buffer)
    dequantize(q, scales, n, bits=8, block=2048, out=None, dtype=fp32, accumulate=False) -> out

On the CPU the compiled op ``cpu_quantize`` (``cpp/cpu/quantize.cpp``: OpenMP over blocks,
AVX-512/AVX2) runs when it loads; on CUDA tensors ``cuda_quantize`` (``cpp/cuda/quantize.cu``);
otherwise, and always with ``use_compiled=False``, the torch reference below (``*_torch``), which
the compiled ops equal bit for bit (tests/test_quantize_kernels.py).
"""

from __future__ import annotations

import torch

from dslaunch.kernels import load_op

_CODES = {torch.float32: 0, torch.bfloat16: 1}
QMAX = {8: 127.0, 4: 7.0}


def nblocks(n: int, block: int) -> int:
    return -(-int(n) // int(block))


def qbytes(n: int, bits: int) -> int:
    """Bytes of quantized values for ``n`` elements."""
    return int(n) if bits == 8 else (int(n) + 1) // 2


def _check(n, bits, block):
    if bits not in QMAX:
        raise ValueError(f"quantize: bits must be 8 or 4, got {bits}")
    if block <= 0 or (bits == 4 and block % 2):
        raise ValueError(f"quantize: block {block} must be positive (and even for int4)")


# -- torch reference ----------------------------------------------------------------------------

def quantize_torch(x: torch.Tensor, bits: int, block: int, q: torch.Tensor,
                   scales: torch.Tensor) -> None:
    n = x.numel()
    nb = nblocks(n, block)
    xf = torch.zeros(nb * block, dtype=torch.float32, device=x.device)
    xf[:n] = x.reshape(-1)
    xb = xf.view(nb, block)
    s = xb.abs().amax(dim=1) / QMAX[bits]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    r = torch.round(xb / safe[:, None]).clamp_(-QMAX[bits], QMAX[bits])
    r = torch.where((s > 0)[:, None], r, torch.zeros_like(r)).reshape(-1)[:n].to(torch.int8)
    scales.copy_(s)
    if bits == 8:
        q.copy_(r.view(torch.uint8))
        return
    if n % 2:
        r = torch.cat([r, r.new_zeros(1)])
    pairs = r.view(-1, 2).to(torch.int16) & 0x0F
    q.copy_((pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8))


def unpack_int4(q: torch.Tensor, n: int) -> torch.Tensor:
    """int4 bytes -> int8 values (n of them)."""
    lo = (q.to(torch.int16) << 12).to(torch.int16) >> 12  # sign-extend the low nibble
    hi = (q.view(torch.int8).to(torch.int16)) >> 4
    return torch.stack([lo, hi], dim=1).reshape(-1)[:n].to(torch.int8)


def dequantize_torch(q, scales, n, bits, block, out, accumulate=False) -> None:
    vals = q.view(torch.int8)[:n] if bits == 8 else unpack_int4(q, n)
    nb = nblocks(n, block)
    v = torch.zeros(nb * block, dtype=torch.float32, device=q.device)
    v[:n] = vals.float()
    v = (v.view(nb, block) * scales[:, None]).reshape(-1)[:n]
    if accumulate:
        out.add_(v)
    else:
        out.copy_(v)


# -- entry points -------------------------------------------------------------------------------

def _op(t: torch.Tensor, use_compiled: bool, op=None):
    if not use_compiled:
        return None
    if op is not None:
        return op
    if t.device.type == "cpu":
        return load_op("cpu_quantize")
    if t.device.type == "cuda":
        return load_op("cuda_quantize")
    return None


def _stream(t) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def quantize_into(x: torch.Tensor, bits: int, block: int, q: torch.Tensor, scales: torch.Tensor,
                  use_compiled: bool = True, op=None) -> bool:
    """Quantize ``x`` into ``q`` (uint8, ``qbytes(n, bits)``) and ``scales`` (fp32, ``nblocks``),
    contiguous tensors on x's device. True when a compiled op did the work."""
    n = x.numel()
    _check(n, bits, block)
    if x.dtype not in _CODES:
        raise ValueError(f"quantize: fp32 or bf16 input, got {x.dtype}")
    if q.numel() != qbytes(n, bits) or scales.numel() != nblocks(n, block):
        raise ValueError(f"quantize: outputs of {q.numel()} bytes / {scales.numel()} scales, "
                         f"expected {qbytes(n, bits)} / {nblocks(n, block)}")
    mod = _op(x, use_compiled and x.is_contiguous() and q.is_contiguous()
              and scales.is_contiguous(), op)
    if mod is None or n == 0:
        quantize_torch(x, bits, block, q, scales)
        return False
    if x.device.type == "cuda":
        mod.quantize(x.data_ptr(), _CODES[x.dtype], n, block, bits, q.data_ptr(),
                     scales.data_ptr(), _stream(x))
    else:
        mod.quantize(x.data_ptr(), _CODES[x.dtype], n, block, bits, q.data_ptr(),
                     scales.data_ptr(), torch.get_num_threads())
    return True


def quantize(x: torch.Tensor, bits: int = 8, block: int = 2048, use_compiled: bool = True,
             op=None):
    """(q, scales) of ``x`` (see the module docstring)."""
    x = x.reshape(-1)
    q = torch.empty(qbytes(x.numel(), bits), dtype=torch.uint8, device=x.device)
    scales = torch.empty(nblocks(x.numel(), block), dtype=torch.float32, device=x.device)
    quantize_into(x.contiguous(), bits, block, q, scales, use_compiled, op)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, n: int, bits: int = 8, block: int = 2048,
               out: torch.Tensor | None = None, dtype=torch.float32, accumulate: bool = False,
               use_compiled: bool = True, op=None) -> torch.Tensor:
    """``n`` values back from ``q``/``scales`` into ``out`` (fp32 or bf16; new if None);
    ``accumulate``: ``out += values`` (fp32 ``out`` only)."""
    _check(n, bits, block)
    if out is None:
        out = torch.empty(n, dtype=dtype, device=q.device)
    if out.dtype not in _CODES or out.numel() != n:
        raise ValueError(f"dequantize: out must be fp32 or bf16 with {n} values")
    if accumulate and out.dtype != torch.float32:
        raise ValueError("dequantize: accumulate needs an fp32 out")
    if q.numel() < qbytes(n, bits) or scales.numel() < nblocks(n, block):
        raise ValueError("dequantize: fewer bytes or scales than n values need")
    mod = _op(q, use_compiled and out.is_contiguous() and q.is_contiguous()
              and scales.is_contiguous(), op)
    if mod is None or n == 0:
        dequantize_torch(q, scales, n, bits, block, out, accumulate)
        return out
    last = torch.cuda.current_stream(q.device).cuda_stream if q.device.type == "cuda" else \
        torch.get_num_threads()
    mod.dequantize(q.data_ptr(), scales.data_ptr(), n, block, bits, out.data_ptr(),
                   _CODES[out.dtype], int(accumulate), last)
    return out

