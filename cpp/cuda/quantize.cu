// Block-wise symmetric int8 / int4 quantization (the layout and arithmetic of
// dslaunch/kernels/quantize.py and cpp/cpu/quantize.cpp, which these equal bit for bit): one CUDA
// block per scale block for quantize (max reduction in shared memory, then one value or one byte
// of two int4 values per thread), a grid-stride loop for dequantize. Division, rounding and the
// dequantize multiply-add use the IEEE round-to-nearest intrinsics (no FMA contraction).
#include "dslaunch_cuda.cuh"

namespace dslaunch_cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline int quant_one(float x, float scale, float qmax) {
  float r = rintf(__fdiv_rn(x, scale));
  r = fminf(fmaxf(r, -qmax), qmax);
  return int(r);
}

template <class T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, int64_t block, int bits,
                                uint8_t* __restrict__ q, float* __restrict__ scales) {
  __shared__ float partial[kThreads];
  const int64_t lo = int64_t(blockIdx.x) * block;
  const int64_t hi = min(n, lo + block);
  float m = 0.f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) m = fmaxf(m, fabsf(load_f(x, i)));
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
    __syncthreads();
  }
  const float qmax = bits == 8 ? 127.f : 7.f;
  const float scale = __fdiv_rn(partial[0], qmax);
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  const bool zero = !(scale > 0.f);
  if (bits == 8) {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      q[i] = uint8_t(int8_t(zero ? 0 : quant_one(load_f(x, i), scale, qmax)));
  } else {  // block is even: the block's bytes are [lo/2, ceil(hi/2))
    for (int64_t i = lo + 2 * int64_t(threadIdx.x); i < hi; i += 2 * int64_t(blockDim.x)) {
      const int a = zero ? 0 : quant_one(load_f(x, i), scale, qmax);
      const int b = (zero || i + 1 >= hi) ? 0 : quant_one(load_f(x, i + 1), scale, qmax);
      q[i / 2] = uint8_t((a & 0x0f) | ((b & 0x0f) << 4));
    }
  }
}

template <class T>
__global__ void dequantize_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales,
                                  int64_t n, int64_t block, int bits, T* __restrict__ out,
                                  int accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int v;
    if (bits == 8) {
      v = int8_t(q[i]);
    } else {
      const uint8_t byte = q[i >> 1];
      v = (i & 1) ? (int8_t(byte) >> 4) : (int8_t(uint8_t(byte << 4)) >> 4);
    }
    float d = __fmul_rn(float(v), scales[i / block]);
    if (accumulate) d = __fadd_rn(load_f(out, i), d);
    store_f(out, i, d);
  }
}

}  // namespace

cudaError_t quantize_blocks(const void* x, int dtype, int64_t n, int64_t block, int bits,
                            uint8_t* q, float* scales, cudaStream_t stream) {
  if ((bits != 8 && bits != 4) || block <= 0 || (bits == 4 && block % 2)) return cudaErrorInvalidValue;
  const int64_t nblocks = (n + block - 1) / block;
  if (nblocks == 0) return cudaSuccess;
  if (nblocks > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(nblocks);
  if (dtype == kF32)
    quantize_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), n, block, bits, q, scales);
  else if (dtype == kBF16)
    quantize_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const bf16_t*>(x), n, block, bits, q, scales);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t dequantize_blocks(const uint8_t* q, const float* scales, int64_t n, int64_t block,
                              int bits, void* out, int dtype, int accumulate, cudaStream_t stream) {
  if ((bits != 8 && bits != 4) || block <= 0 || (bits == 4 && block % 2)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dtype == kF32)
    dequantize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(q, scales, n, block, bits,
                                                                       static_cast<float*>(out), accumulate);
  else if (dtype == kBF16 && !accumulate)
    dequantize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(q, scales, n, block, bits,
                                                                       static_cast<bf16_t*>(out), 0);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace dslaunch_cuda
