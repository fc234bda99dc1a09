// Shared pieces of dslaunch's CUDA kernels: bf16 as uint16_t bit patterns (round to nearest even,
// exactly like the CPU ops and torch), and the host-side launch API the bindings call.
// Torch-free on purpose: `make cuda-check` compiles every .cu with plain nvcc in seconds.
#pragma once

#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>

namespace dslaunch_cuda {

using bf16_t = uint16_t;

__host__ __device__ inline float bits_to_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

__host__ __device__ inline uint32_t f32_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

__host__ __device__ inline float bf16_to_f32(bf16_t h) {
  return bits_to_f32(static_cast<uint32_t>(h) << 16);
}

__host__ __device__ inline bf16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_t>(u >> 16);
}

__device__ inline float load_f(const float* p, int64_t i) { return p[i]; }
__device__ inline float load_f(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
__device__ inline void store_f(float* p, int64_t i, float x) { p[i] = x; }
__device__ inline void store_f(bf16_t* p, int64_t i, float x) { p[i] = f32_to_bf16(x); }

// dtype codes shared with the CPU ops: 0 float32, 1 bfloat16, -1 absent
enum { kF32 = 0, kBF16 = 1, kNone = -1 };

// ---- fused multi-tensor Adam/AdamW ----------------------------------------------------------
struct AdamTensor {
  void* param;        // kF32 or kBF16
  const void* grad;   // kF32 or kBF16
  float* exp_avg;
  float* exp_avg_sq;
  void* copy;         // optional second output of the updated param (kF32 / kBF16), may be null
  int64_t n;
};

struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  int adamw, bias_correction;
  double grad_scale;
};

// All tensors of one call share the dtype codes. Returns cudaSuccess or the launch error.
cudaError_t fused_adam(const AdamTensor* tensors, int ntensors, int param_dtype, int grad_dtype,
                       int copy_dtype, const AdamArgs& args, cudaStream_t stream);

// ---- 1-bit compression with error feedback --------------------------------------------------
// pack: c = x + error; per block of `block` elements scale = ||c_b||_2 / sqrt(count_b);
// bit (element 8i+k -> bit k of byte i) = c >= 0; error = c - (bit ? scale : -scale).
// n must be a multiple of 8 (callers pad); bits has n/8 bytes, scales ceil(n/block) floats.
cudaError_t onebit_pack(const float* x, float* error, uint8_t* bits, float* scales, int64_t n,
                        int block, cudaStream_t stream);
// unpack: out = (accumulate ? out : 0) + alpha * (bit ? scale : -scale)
cudaError_t onebit_unpack(const uint8_t* bits, const float* scales, float* out, int64_t n,
                          int block, float alpha, int accumulate, cudaStream_t stream);

// ---- block-wise symmetric int8 / int4 quantization (dslaunch/kernels/quantize.py) ------------
// per block of `block` values (the last may be shorter): scale = max|x| / qmax (127 or 7),
// q = clamp(rint(x / scale), -qmax, qmax) (0 where scale is 0). int8: a byte per value; int4:
// value 2i in the low nibble of byte i (block even). x: kF32 or kBF16.
cudaError_t quantize_blocks(const void* x, int dtype, int64_t n, int64_t block, int bits,
                            uint8_t* q, float* scales, cudaStream_t stream);
// out (kF32 or kBF16) = q * scale, or out += q * scale (accumulate, kF32 only)
cudaError_t dequantize_blocks(const uint8_t* q, const float* scales, int64_t n, int64_t block,
                              int bits, void* out, int dtype, int accumulate, cudaStream_t stream);

// ---- conversion ------------------------------------------------------------------------------
cudaError_t f32_to_bf16(const float* in, bf16_t* out, int64_t n, cudaStream_t stream);
cudaError_t bf16_to_f32(const bf16_t* in, float* out, int64_t n, cudaStream_t stream);

inline int grid_for(int64_t n, int threads, int max_blocks = 65535) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

}  // namespace dslaunch_cuda
