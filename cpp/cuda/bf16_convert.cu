// fp32 <-> bf16 (round to nearest even, NaN stays quiet NaN): bit-identical to torch's .bfloat16()
// and to the CPU ops' conversion.
#include "dslaunch_cuda.cuh"

namespace dslaunch_cuda {
namespace {

constexpr int kThreads = 256;

__global__ void to_bf16(const float* __restrict__ in, bf16_t* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = f32_to_bf16(in[i]);
}

__global__ void to_f32(const bf16_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16_to_f32(in[i]);
}

}  // namespace

cudaError_t f32_to_bf16(const float* in, bf16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  to_bf16<<<grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t bf16_to_f32(const bf16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  to_f32<<<grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

}  // namespace dslaunch_cuda
