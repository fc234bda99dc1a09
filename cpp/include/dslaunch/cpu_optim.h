// CPU optimizer kernels: Adam/AdamW, Adagrad, Lion over flat arrays. Header-only, torch-free.
//
// Each kernel makes ONE pass over memory: it reads the parameter (fp32 or bf16), the gradient
// (fp32 or bf16, times grad_scale), the fp32 states, writes the parameter and states back and,
// when `copy` is given, also writes the updated parameter to a second array (fp32 or bf16) in the
// same pass. That last form is the fused ZeRO-Offload entry: fp32 master shard + bf16 gradient
// shard in, updated master + bf16 model copy out.
//
// The arithmetic follows torch.optim's single-tensor implementations operation by operation
// (lerp_ and addcmul_ -> fma, sqrt, addcdiv_; Adam's sqrt(v)/sqrt(bc2) is a multiply by the
// reciprocal), so fp32 results agree with torch's to float rounding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dslaunch/simd.h"

namespace dslaunch {

struct NoCopy {};

// Below this many elements one thread does the work: starting a team costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;
// Work is handed to threads in chunks of at least this many elements, guided schedule: the first
// pieces are large and contiguous (like a static split, good for the prefetchers), the last ones
// small, so when the cores are shared a descheduled thread does not hold the whole step back at
// the closing barrier.
constexpr int64_t kChunk = 1 << 16;

// Runs f(VecOps{}, i) over each chunk in steps of VecOps::W, then f(ScalarOps{}, i) over the
// chunk's tail (only the last chunk has one: kChunk is a multiple of every W).
//
// f must capture by value ([=]), and each chunk works on its own copy of it: a SIMD store
// (_mm256_storeu_ps ...) may alias any memory, so pointers and constants that live behind a
// reference (a [&] capture, or the closure shared with the OpenMP team) are re-loaded after every
// store. A local copy whose address never escapes stays in registers. Measured on the same arrays
// against torch's fused Adam, 50M fp32, 1 thread: 0.82-0.87x with [&], 0.97-1.07x with the copy.
template <class F>
inline void elementwise(int64_t n, int nthreads, const F& f) {
  auto run = [&](int64_t lo, int64_t hi) {
    const F body = f;
    int64_t i = lo;
    for (; i + VecOps::W <= hi; i += VecOps::W) body(VecOps{}, i);
    for (; i < hi; ++i) body(ScalarOps{}, i);
  };
#ifdef _OPENMP
  if (nthreads > 1 && n >= kMinParallel) {
    const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(nthreads) schedule(guided, 1)
    for (int64_t c = 0; c < nchunks; ++c) run(c * kChunk, std::min(n, (c + 1) * kChunk));
    return;
  }
#endif
  (void)nthreads;
  run(0, n);
}

// Calls f with std::true_type / std::false_type for each flag, so that the per-element loop is
// compiled once per combination, the options decided at compile time (no tests in the loop).
template <class F>
inline void with_flags(bool a, bool b, bool c, F&& f) {
  auto pick = [](bool v, auto&& g) {
    if (v) g(std::true_type{}); else g(std::false_type{});
  };
  pick(a, [&](auto A) { pick(b, [&](auto B) { pick(c, [&](auto C) { f(A, B, C); }); }); });
}

template <class O, class CT>
inline void store_copy(CT* copy, int64_t i, typename O::V x) {
  if constexpr (!std::is_same_v<CT, NoCopy>) O::store(copy + i, x);
}

// Hyper-parameters arrive as doubles (Python floats) and every derived constant (1 - beta,
// lr / bias_correction, 1 - lr * wd) is computed in double and rounded to float once, exactly as
// torch does with Python scalars; rounding beta to float first would shift 1 - beta by ~1e-5.
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;          // 1-based step number this update makes
  bool adamw;            // decoupled weight decay (AdamW) instead of L2 added to the gradient
  bool bias_correction;
  double grad_scale;     // gradient multiplier (1/loss_scale, 1/world_size ...); 1 = none
};

template <class PT, class GT, class CT>
void adam_kernel(PT* p, const GT* g, float* m, float* v, CT* copy, int64_t n, const AdamArgs& a,
                 int nthreads) {
  // Constants in double then rounded once, as torch does with Python floats.
  double bc1 = 1.0, bc2 = 1.0;
  if (a.bias_correction) {
    bc1 = 1.0 - std::pow(a.beta1, double(a.step));
    bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  }
  const float neg_step = float(-(a.lr / bc1));
  // torch divides sqrt(v) by sqrt(bc2); a multiply by the (double-rounded-once) reciprocal frees
  // the divider for the one division that must stay (m / denom) -- the kernel is close to compute
  // bound at 2 threads -- and differs from torch by at most an ulp of the denominator.
  const float inv_bc2_sqrt = float(1.0 / std::sqrt(bc2));
  const float w1 = float(1.0 - a.beta1);
  const float w2 = float(1.0 - a.beta2);
  const float decay = float(1.0 - a.lr * a.weight_decay);
  const float wd = float(a.weight_decay), b2 = float(a.beta2), eps = float(a.eps);
  const float gs = float(a.grad_scale);
  const bool l2 = wd != 0.f && !a.adamw, decoupled = wd != 0.f && a.adamw, scale = gs != 1.f;
  with_flags(scale, l2, decoupled, [&](auto SCALE, auto L2, auto DECOUPLED) {
    elementwise(n, nthreads, [=](auto ops, int64_t i) {
      using O = decltype(ops);
      auto grad = O::load(g + i);
      if constexpr (SCALE) grad = O::mul(grad, O::set1(gs));
      auto param = O::load(p + i);
      if constexpr (L2) grad = O::fma(param, O::set1(wd), grad);  // grad.add(param, alpha=wd)
      if constexpr (DECOUPLED) param = O::mul(param, O::set1(decay));  // param.mul_(1 - lr*wd)
      auto mm = O::load(m + i);
      mm = O::fma(O::set1(w1), O::sub(grad, mm), mm);             // exp_avg.lerp_(grad, 1-b1)
      auto vv = O::mul(O::load(v + i), O::set1(b2));              // exp_avg_sq.mul_(b2)
      vv = O::fma(O::mul(O::set1(w2), grad), grad, vv);          //   .addcmul_(g, g, 1-b2)
      auto denom = O::add(O::mul(O::sqrt(vv), O::set1(inv_bc2_sqrt)), O::set1(eps));
      param = O::add(param, O::div(O::mul(O::set1(neg_step), mm), denom));  // addcdiv_
      O::store(m + i, mm);
      O::store(v + i, vv);
      O::store(p + i, param);
      store_copy<O>(copy, i, param);
    });
  });
}

struct AdagradArgs {
  double lr, lr_decay, eps, weight_decay;
  int64_t step;  // 1-based
  double grad_scale;
};

template <class PT, class GT, class CT>
void adagrad_kernel(PT* p, const GT* g, float* sum, CT* copy, int64_t n,
                    const AdagradArgs& a, int nthreads) {
  const float neg_clr = float(-(a.lr / (1.0 + double(a.step - 1) * a.lr_decay)));
  const float wd = float(a.weight_decay), eps = float(a.eps), gs = float(a.grad_scale);
  const bool l2 = wd != 0.f, scale = gs != 1.f;
  elementwise(n, nthreads, [=](auto ops, int64_t i) {
    using O = decltype(ops);
    auto grad = O::load(g + i);
    if (scale) grad = O::mul(grad, O::set1(gs));
    auto param = O::load(p + i);
    if (l2) grad = O::fma(param, O::set1(wd), grad);            // grad.add(param, alpha=wd)
    auto s = O::fma(grad, grad, O::load(sum + i));              // state_sum.addcmul_(g, g, 1)
    auto std_ = O::add(O::sqrt(s), O::set1(eps));
    param = O::add(param, O::div(O::mul(O::set1(neg_clr), grad), std_));  // addcdiv_
    O::store(sum + i, s);
    O::store(p + i, param);
    store_copy<O>(copy, i, param);
  });
}

struct LionArgs {
  double lr, beta1, beta2, weight_decay;
  double grad_scale;
};

// Lion (Chen et al. 2023): p *= 1 - lr*wd; p -= lr * sign(b1*m + (1-b1)*g); m = b2*m + (1-b2)*g.
template <class PT, class GT, class CT>
void lion_kernel(PT* p, const GT* g, float* m, CT* copy, int64_t n,
                 const LionArgs& a, int nthreads) {
  const float decay = float(1.0 - a.lr * a.weight_decay);
  const float w1 = float(1.0 - a.beta1), w2 = float(1.0 - a.beta2);
  const float b1 = float(a.beta1), b2 = float(a.beta2), neg_lr = float(-a.lr);
  const float gs = float(a.grad_scale);
  const bool decoupled = a.weight_decay != 0.0, scale = gs != 1.f;
  elementwise(n, nthreads, [=](auto ops, int64_t i) {
    using O = decltype(ops);
    auto grad = O::load(g + i);
    if (scale) grad = O::mul(grad, O::set1(gs));
    auto param = O::load(p + i);
    if (decoupled) param = O::mul(param, O::set1(decay));
    auto mm = O::load(m + i);
    auto u = O::fma(grad, O::set1(w1), O::mul(mm, O::set1(b1)));  // m*b1 + g*(1-b1)
    param = O::add(param, O::signmul(u, O::set1(neg_lr)));         // p.add_(sign(u), alpha=-lr)
    mm = O::fma(grad, O::set1(w2), O::mul(mm, O::set1(b2)));       // m.mul_(b2).add_(g, 1-b2)
    O::store(m + i, mm);
    O::store(p + i, param);
    store_copy<O>(copy, i, param);
  });
}

}  // namespace dslaunch
