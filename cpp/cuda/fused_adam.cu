// Fused multi-tensor Adam/AdamW: one launch updates a whole list of tensors. The list is cut into
// chunks of kChunk elements; block b walks chunks b, b+grid, ... Per element the arithmetic is the
// CPU op's (torch's operation order, fp32, IEEE sqrt and division), bf16 params/grads/copies
// round to nearest even.
#include <cmath>
#include <cstring>
#include <vector>

#include "dslaunch_cuda.cuh"

namespace dslaunch_cuda {
namespace {

constexpr int64_t kChunk = 65536;
constexpr int kThreads = 512;

struct Consts {
  float neg_step, bc2_sqrt, w1, w2, b2, eps, wd, decay, gs;
  int l2, decoupled;
};

template <class PT, class GT, class CT>
__global__ void adam_kernel(const AdamTensor* __restrict__ ts, const int* __restrict__ chunk_tensor,
                            const int64_t* __restrict__ chunk_start, int nchunks, Consts c) {
  for (int k = blockIdx.x; k < nchunks; k += gridDim.x) {
    const AdamTensor t = ts[chunk_tensor[k]];
    PT* p = static_cast<PT*>(t.param);
    const GT* g = static_cast<const GT*>(t.grad);
    CT* cp = static_cast<CT*>(t.copy);
    const int64_t lo = chunk_start[k], hi = min(t.n, lo + kChunk);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      float grad = load_f(g, i);
      if (c.gs != 1.f) grad *= c.gs;
      float param = load_f(p, i);
      if (c.l2) grad = __fmaf_rn(param, c.wd, grad);
      if (c.decoupled) param = __fmul_rn(param, c.decay);
      float m = t.exp_avg[i];
      m = __fmaf_rn(c.w1, __fsub_rn(grad, m), m);
      float v = __fmul_rn(t.exp_avg_sq[i], c.b2);
      v = __fmaf_rn(__fmul_rn(c.w2, grad), grad, v);
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
      param = __fadd_rn(param, __fdiv_rn(__fmul_rn(c.neg_step, m), denom));
      t.exp_avg[i] = m;
      t.exp_avg_sq[i] = v;
      store_f(p, i, param);
      if (cp != nullptr) store_f(cp, i, param);
    }
  }
}

template <class PT, class GT, class CT>
void launch(const AdamTensor* d_ts, const int* d_ct, const int64_t* d_cs, int nchunks,
            const Consts& c, cudaStream_t s) {
  adam_kernel<PT, GT, CT><<<grid_for(nchunks, 1, 4096), kThreads, 0, s>>>(d_ts, d_ct, d_cs, nchunks, c);
}

template <class PT, class GT>
bool dispatch_copy(int cdt, const AdamTensor* a, const int* b, const int64_t* d, int n,
                   const Consts& c, cudaStream_t s) {
  switch (cdt) {
    case kNone:  // copy pointers are null; the CT type is then irrelevant
    case kF32: launch<PT, GT, float>(a, b, d, n, c, s); return true;
    case kBF16: launch<PT, GT, bf16_t>(a, b, d, n, c, s); return true;
  }
  return false;
}

template <class PT>
bool dispatch_grad(int gdt, int cdt, const AdamTensor* a, const int* b, const int64_t* d, int n,
                   const Consts& c, cudaStream_t s) {
  switch (gdt) {
    case kF32: return dispatch_copy<PT, float>(cdt, a, b, d, n, c, s);
    case kBF16: return dispatch_copy<PT, bf16_t>(cdt, a, b, d, n, c, s);
  }
  return false;
}

}  // namespace

cudaError_t fused_adam(const AdamTensor* tensors, int ntensors, int pdt, int gdt, int cdt,
                       const AdamArgs& a, cudaStream_t stream) {
  std::vector<int> chunk_tensor;
  std::vector<int64_t> chunk_start;
  for (int t = 0; t < ntensors; ++t) {
    if (cdt == kNone && tensors[t].copy != nullptr) return cudaErrorInvalidValue;
    for (int64_t lo = 0; lo < tensors[t].n; lo += kChunk) {
      chunk_tensor.push_back(t);
      chunk_start.push_back(lo);
    }
  }
  const int nchunks = static_cast<int>(chunk_tensor.size());
  if (nchunks == 0) return cudaSuccess;
  double bc1 = 1.0, bc2 = 1.0;
  if (a.bias_correction) {
    bc1 = 1.0 - std::pow(a.beta1, double(a.step));
    bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  }
  Consts c{float(-(a.lr / bc1)), float(std::sqrt(bc2)), float(1.0 - a.beta1),
           float(1.0 - a.beta2), float(a.beta2), float(a.eps), float(a.weight_decay),
           float(1.0 - a.lr * a.weight_decay), float(a.grad_scale),
           a.weight_decay != 0.0 && !a.adamw, a.weight_decay != 0.0 && a.adamw};

  // one device buffer: tensor table, chunk->tensor, chunk->start (pageable memcpyAsync stages the
  // host data before returning, so the vectors may die after the call)
  const size_t ts_bytes = sizeof(AdamTensor) * ntensors;
  const size_t ct_bytes = sizeof(int) * nchunks, cs_off = (ts_bytes + ct_bytes + 7) & ~size_t(7);
  const size_t total = cs_off + sizeof(int64_t) * nchunks;
  std::vector<char> host(total);
  std::memcpy(host.data(), tensors, ts_bytes);
  std::memcpy(host.data() + ts_bytes, chunk_tensor.data(), ct_bytes);
  std::memcpy(host.data() + cs_off, chunk_start.data(), sizeof(int64_t) * nchunks);
  char* dev = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&dev), total, stream);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(dev, host.data(), total, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) {
    auto* d_ts = reinterpret_cast<const AdamTensor*>(dev);
    auto* d_ct = reinterpret_cast<const int*>(dev + ts_bytes);
    auto* d_cs = reinterpret_cast<const int64_t*>(dev + cs_off);
    bool ok = pdt == kF32 ? dispatch_grad<float>(gdt, cdt, d_ts, d_ct, d_cs, nchunks, c, stream)
            : pdt == kBF16 ? dispatch_grad<bf16_t>(gdt, cdt, d_ts, d_ct, d_cs, nchunks, c, stream)
                           : false;
    err = ok ? cudaGetLastError() : cudaErrorInvalidValue;
  }
  cudaError_t ferr = cudaFreeAsync(dev, stream);
  return err != cudaSuccess ? err : ferr;
}

}  // namespace dslaunch_cuda
