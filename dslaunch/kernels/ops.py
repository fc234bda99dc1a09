"""The compiled ops dslaunch knows, and where their sources live (relative to the source root).

CPU ops are torch-free C++ with a small CPython binding; CUDA ops are torch-free kernels (.cu)
plus a binding (.cpp) that launches them on the stream Python passes in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str                 # "cpu" or "cuda"
    sources: tuple[str, ...]  # relative to the source root (cpp/ or dslaunch/kernels/csrc/)
    description: str


OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec("cpu_adam", "cpu", ("cpu/cpu_adam.cpp",), "Adam/AdamW CPU step, fp32/bf16, fused copy"),
    OpSpec("cpu_adagrad", "cpu", ("cpu/cpu_adagrad.cpp",), "Adagrad CPU step"),
    OpSpec("cpu_lion", "cpu", ("cpu/cpu_lion.cpp",), "Lion CPU step"),
    OpSpec("onebit_pack", "cpu", ("cpu/onebit_pack.cpp",),
           "1-bit sign pack with error feedback, and decode, for the compressed all-reduce"),
    OpSpec("cpu_quantize", "cpu", ("cpu/quantize.cpp",),
           "block-wise symmetric int8/int4 quantize/dequantize (ZeRO++ qwZ/qgZ)"),
    OpSpec("cpu_block_sparse_attn", "cpu", ("cpu/block_sparse_attn.cpp",),
           "block-sparse attention forward on the kept blocks (sparse_attention)"),
    OpSpec("cpu_membw", "cpu", ("cpu/cpu_membw.cpp",),
           "STREAM-style bandwidth probes (copy/triad/read) for benchmarks"),
    OpSpec("async_io", "cpu", ("aio/aio_engine.cpp", "aio/aio_py.cpp"),
           "async file I/O (kernel AIO / thread pool, O_DIRECT) for nvme-tune and NVMe offload"),
    OpSpec("cuda_fused_adam", "cuda", ("cuda/fused_adam.cu", "cuda/fused_adam_binding.cpp"),
           "multi-tensor Adam/AdamW on the GPU"),
    OpSpec("cuda_onebit", "cuda", ("cuda/onebit.cu", "cuda/onebit_binding.cpp"),
           "1-bit sign pack/unpack with error feedback"),
    OpSpec("cuda_quantize", "cuda", ("cuda/quantize.cu", "cuda/quantize_binding.cpp"),
           "block-wise symmetric int8/int4 quantize/dequantize (ZeRO++ qwZ/qgZ)"),
    OpSpec("cuda_bf16", "cuda", ("cuda/bf16_convert.cu", "cuda/bf16_binding.cpp"),
           "fp32 <-> bf16 conversion"),
]}
