// 1-bit compression with error feedback (the layout of dslaunch/engine/optim/onebit/compressed.py):
// one CUDA block per scale block; sign bits packed 8 per byte, element 8i+k in bit k.
#include "dslaunch_cuda.cuh"

namespace dslaunch_cuda {
namespace {

constexpr int kThreads = 256;

__global__ void pack_kernel(const float* __restrict__ x, float* __restrict__ error,
                            uint8_t* __restrict__ bits, float* __restrict__ scales, int64_t n,
                            int block) {
  __shared__ float partial[kThreads];
  const int64_t lo = int64_t(blockIdx.x) * block;
  const int64_t hi = min(n, lo + block);
  // 1) sum of squares of the corrected values x + error
  float ss = 0.f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float c = x[i] + error[i];
    ss = __fmaf_rn(c, c, ss);
  }
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float count = float(hi - lo);
  const float scale = hi > lo ? sqrtf(partial[0]) / sqrtf(count) : 0.f;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  // 2) one thread per output byte: 8 signs, and the new error for those 8 values
  for (int64_t byte = lo / 8 + threadIdx.x; byte * 8 < hi; byte += blockDim.x) {
    uint8_t b = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = byte * 8 + k;
      const float c = x[i] + error[i];
      const bool pos = c >= 0.f;
      b |= uint8_t(pos) << k;
      error[i] = c - (pos ? scale : -scale);
    }
    bits[byte] = b;
  }
}

__global__ void unpack_kernel(const uint8_t* __restrict__ bits, const float* __restrict__ scales,
                              float* __restrict__ out, int64_t n, int block, float alpha,
                              int accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float s = scales[i / block];
    const float d = (bits[i >> 3] >> (i & 7)) & 1 ? s : -s;
    out[i] = accumulate ? __fmaf_rn(alpha, d, out[i]) : alpha * d;
  }
}

}  // namespace

cudaError_t onebit_pack(const float* x, float* error, uint8_t* bits, float* scales, int64_t n,
                        int block, cudaStream_t stream) {
  if (n % 8 != 0 || block <= 0 || block % 8 != 0) return cudaErrorInvalidValue;
  const int64_t nblocks = (n + block - 1) / block;
  if (nblocks == 0) return cudaSuccess;
  if (nblocks > 0x7fffffff) return cudaErrorInvalidValue;
  pack_kernel<<<static_cast<unsigned>(nblocks), kThreads, 0, stream>>>(x, error, bits, scales, n, block);
  return cudaGetLastError();
}

cudaError_t onebit_unpack(const uint8_t* bits, const float* scales, float* out, int64_t n,
                          int block, float alpha, int accumulate, cudaStream_t stream) {
  if (block <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  unpack_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(bits, scales, out, n, block, alpha,
                                                                 accumulate);
  return cudaGetLastError();
}

}  // namespace dslaunch_cuda
