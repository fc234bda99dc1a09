"""Block-wise int8/int4 quantization (dslaunch/kernels/quantize.py, the compiled op cpu_quantize):
the error bound per block, exact round trips, zero / constant blocks, short and odd tails, and the
compiled op equal to the torch reference bit for bit at every SIMD level this CPU has."""

import pytest
import torch

from dslaunch.kernels import builder, cpu_features
from dslaunch.kernels import quantize as Q

LEVELS = [lvl for lvl in ("avx512", "avx2", "scalar") if cpu_features.cpu_info().supports(lvl)]
SIZES = [1, 7, 255, 256, 257, 4097, 30_001]  # short, odd, exact, one-over and long tails


@pytest.fixture(scope="module", params=LEVELS)
def level_op(request):
    mp = pytest.MonkeyPatch()
    mp.setenv("DSLAUNCH_SIMD", request.param)
    try:
        op = builder.load("cpu_quantize")
    finally:
        mp.undo()
    assert op.simd_level() == request.param
    return op


def _data(n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed + n)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 2, n, dtype=torch.float32)
    return x.to(dtype)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_equals_torch_reference_bit_for_bit(level_op, bits, dtype):
    for n in SIZES:
        for block in (6, 256, 2048):
            x = _data(n, dtype=dtype)
            q1, s1 = Q.quantize(x, bits, block, op=level_op)
            q2, s2 = Q.quantize(x, bits, block, use_compiled=False)
            assert torch.equal(s1, s2) and torch.equal(q1, q2), (n, block)
            for out_dtype in (torch.float32, torch.bfloat16):
                d1 = Q.dequantize(q1, s1, n, bits, block, dtype=out_dtype, op=level_op)
                d2 = Q.dequantize(q1, s1, n, bits, block, dtype=out_dtype, use_compiled=False)
                assert torch.equal(d1, d2), (n, block, out_dtype)
            acc1, acc2 = x.float().clone(), x.float().clone()
            Q.dequantize(q1, s1, n, bits, block, out=acc1, accumulate=True, op=level_op)
            Q.dequantize(q1, s1, n, bits, block, out=acc2, accumulate=True, use_compiled=False)
            assert torch.equal(acc1, acc2), (n, block)


@pytest.mark.parametrize("bits,qmax", [(8, 127), (4, 7)])
def test_error_within_half_a_scale_per_block(bits, qmax):
    """|x - deq(q(x))| <= scale / 2 = max|block| / qmax / 2, up to the float rounding of x / scale
    and q * scale (a relative 2^-22 of the block's max here)."""
    for n in SIZES:
        for block in (256, 2048):
            x = _data(n, seed=1)
            q, s = Q.quantize(x, bits, block)
            back = Q.dequantize(q, s, n, bits, block)
            nb = Q.nblocks(n, block)
            pad = torch.zeros(nb * block)
            pad[:n] = (back - x).abs()
            amax = torch.zeros(nb * block)
            amax[:n] = x.abs()
            amax = amax.view(nb, block).amax(dim=1)
            assert torch.equal(s, amax / qmax)
            err = pad.view(nb, block).amax(dim=1)
            assert (err <= amax / qmax / 2 + amax * 2 ** -22).all(), (n, block)
            assert q.numel() == (n if bits == 8 else (n + 1) // 2)


@pytest.mark.parametrize("bits,qmax", [(8, 127), (4, 7)])
def test_representable_values_zeros_and_constants_round_trip_exactly(bits, qmax):
    block = 64
    g = torch.Generator().manual_seed(3)
    # every block holds +-qmax (so scale = 2^-e exactly) and other multiples of the scale
    ints = torch.randint(-qmax, qmax + 1, (10, block), generator=g).float()
    ints[:, 0] = qmax
    ints[1::2, 5] = -qmax
    x = (ints * torch.tensor([2.0 ** -e for e in range(10)])[:, None]).reshape(-1)[:-3]
    zeros = torch.zeros(2 * block + 1)
    const = torch.full((block + 5,), -qmax * 0.25)
    for v in (x, zeros, const):
        q, s = Q.quantize(v, bits, block)
        assert torch.equal(Q.dequantize(q, s, v.numel(), bits, block), v)
        assert torch.equal(Q.dequantize(q, s, v.numel(), bits, block, dtype=torch.bfloat16),
                           v.bfloat16())
    q, s = Q.quantize(zeros, bits, block)
    assert (q == 0).all() and (s == 0).all()


def test_int4_layout_two_values_per_byte_low_nibble_first():
    x = torch.tensor([7.0, -7.0, 1.0, -1.0, 3.0])  # scale 1
    q, s = Q.quantize(x, 4, 6)
    assert s.tolist() == [1.0]
    assert q.tolist() == [0x97, 0xF1, 0x03]  # (7, -7), (1, -1), (3, pad 0)
    q8, _ = Q.quantize(x, 8, 6)
    assert q8.view(torch.int8).tolist() == [127, -127, 18, -18, 54]


def test_bad_arguments_are_refused_with_the_reason():
    x = torch.ones(10)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        Q.quantize(x, 2, 8)
    with pytest.raises(ValueError, match="even for int4"):
        Q.quantize(x, 4, 7)
    with pytest.raises(ValueError, match="accumulate needs an fp32"):
        q, s = Q.quantize(x, 8, 8)
        Q.dequantize(q, s, 10, 8, 8, out=torch.zeros(10, dtype=torch.bfloat16), accumulate=True)
