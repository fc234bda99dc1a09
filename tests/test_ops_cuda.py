"""CUDA ops: every .cu compiles with nvcc for sm_80 and sm_90 (no GPU needed), and where a GPU is
present the ops equal the CPU op / torch."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
NVCC = "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else shutil.which("nvcc")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (it is part of this project's machine image)")
def test_cuda_check_compiles_every_cu_for_sm80_and_sm90(tmp_path):
    out = subprocess.run(["make", "--no-print-directory", "-f", "cpp/cuda/Makefile.check",
                          f"OUT={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    cu = sorted(p.stem for p in (REPO / "cpp" / "cuda").glob("*.cu"))
    assert sorted(p.stem for p in tmp_path.glob("*.o")) == cu and len(cu) == 4
    for obj in tmp_path.glob("*.o"):  # a cubin per architecture is embedded in each object
        data = obj.read_bytes()  # (ptxas records "-arch sm_NN" in each cubin it writes)
        assert b"-arch sm_80" in data and b"-arch sm_90" in data and b"-arch sm_86" not in data


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_cuda_check_fails_on_a_broken_kernel(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "cpp" / "cuda", src)
    (src / "broken.cu").write_text("__global__ void k() { undefined_symbol(); }\n")
    out = subprocess.run(["make", "--no-print-directory", "-f", str(src / "Makefile.check"),
                          f"OUT={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode != 0 and "undefined_symbol" in out.stdout + out.stderr


@needs_gpu
def test_cuda_fused_adam_equals_cpu_op():
    from dslaunch.kernels import cpu_optim, cuda_ops

    torch.manual_seed(0)
    sizes = [1, 7, 1023, 70000]
    ps = [torch.randn(n) for n in sizes]
    gs = [torch.randn(n) for n in sizes]
    cpu = [(p.clone(), torch.zeros(n), torch.zeros(n)) for p, n in zip(ps, sizes)]
    gpu = [(p.cuda(), torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda"))
           for p, n in zip(ps, sizes)]
    for s in range(1, 11):
        for (p, m, v), g in zip(cpu, gs):
            cpu_optim.adam_step(p, g, m, v, step=s, lr=1e-2, weight_decay=0.1, adamw=True)
        assert cuda_ops.fused_adam([t[0] for t in gpu], [g.cuda() for g in gs],
                                   [t[1] for t in gpu], [t[2] for t in gpu], step=s, lr=1e-2,
                                   weight_decay=0.1, adamw=True)
    for (p, _, _), (pg, _, _) in zip(cpu, gpu):
        assert (pg.cpu() - p).abs().max() <= 1e-6 * p.abs().max()


@needs_gpu
def test_cuda_onebit_and_bf16_match_torch():
    from dslaunch.engine.optim.onebit.compressed import pack_bits
    from dslaunch.kernels import cuda_ops

    x = torch.randn(4096 * 3 + 8, device="cuda")
    err = torch.zeros_like(x)
    bits, scales = cuda_ops.onebit_pack(x, err, block=4096)
    assert torch.equal(bits.cpu(), pack_bits((x >= 0).cpu()))
    out = torch.empty_like(x)
    cuda_ops.onebit_unpack(bits, scales, out, block=4096)
    torch.testing.assert_close(out + err, x)  # error feedback keeps what was lost
    assert torch.equal(cuda_ops.to_bf16(x), x.bfloat16())
    assert torch.equal(cuda_ops.to_f32(x.bfloat16()), x.bfloat16().float())


@needs_gpu
def test_cuda_quantize_equals_cpu_op_bit_for_bit():
    from dslaunch.kernels import quantize as Q

    assert Q.load_op("cuda_quantize") is not None
    for bits in (8, 4):
        for dtype in (torch.float32, torch.bfloat16):
            for n, block in ((1, 6), (4097, 256), (100_003, 2048)):
                x = (torch.randn(n) * torch.logspace(-3, 2, n)).to(dtype)
                q, s = Q.quantize(x, bits, block)
                qg, sg = Q.quantize(x.cuda(), bits, block)
                assert torch.equal(qg.cpu(), q) and torch.equal(sg.cpu(), s), (bits, dtype, n)
                for out_dtype in (torch.float32, torch.bfloat16):
                    d = Q.dequantize(q, s, n, bits, block, dtype=out_dtype)
                    dg = Q.dequantize(qg, sg, n, bits, block, dtype=out_dtype)
                    assert torch.equal(dg.cpu(), d), (bits, dtype, n, out_dtype)
                acc, accg = x.float().clone(), x.float().cuda()
                Q.dequantize(q, s, n, bits, block, out=acc, accumulate=True)
                Q.dequantize(qg, sg, n, bits, block, out=accg, accumulate=True)
                assert torch.equal(accg.cpu(), acc)
