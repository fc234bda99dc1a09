// Op "cpu_block_sparse_attn": the forward of block-sparse attention on the CPU, computing only
// the blocks a layout keeps (dslaunch/engine/features/sparse_attention/block_attention.py holds the torch
// path this must equal, and the backward).
//
// q, k, v, out: fp32 [B, H, L, D] contiguous; L = n * block. The layout comes as the torch
// path's table: block rows in groups of `group`; cols int64 [H, n/group, W] (the group's kept
// column blocks), keep uint8 [H, n/group, group, W] (1: this block row keeps that slot).
// For each (batch, head, block row), OpenMP-parallel: the block's queries (scaled) against each
// kept key block (transposed into a small buffer so the inner loop runs over keys), an online
// softmax per query row (running max, sum and weighted sum of values), then
// out = sum / total and lse = max + log(total) (lse is what the torch backward recomputes with).
// A row that keeps nothing gets out 0 and lse +inf, as the torch path.
//
// Masks (optional, 0 for none): kpm fp32 [B, L] and am fp32 [L, L], additive (-inf masks),
// added to the scaled scores as the torch path adds them.
//
// forward(q, k, v, cols, keep, kpm, am, out, lse, B, H, L, D, block, group, W, scale, nthreads)
//
// backward(q, k, v, out, lse, dout, cols, keep, kpm, am, dq, dk, dv, B, H, L, D, block, group, W, scale,
//          nthreads): dq, dk, dv fp32 [B, H, L, D], zero on entry. Per (batch, head), OpenMP over
// those pairs (dk and dv of a pair are written by one thread: no atomics), block rows in order:
// p = exp(scale * q k^T - lse) recomputed per kept block, dp = dout v^T,
// ds = p * (dp - rowsum(dout * out)), dq += scale * ds k, dk += scale * ds^T q, dv += p^T dout.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_block_sparse_attn
#endif

namespace {

// The additive masks on one query row's scores against one key block: kpm (this batch's [L])
// at the keys, am ([L, L] from this block row's first query) at (query, key); null: none.
inline void add_masks(float* si, const float* kpm, const float* am, int64_t i, int64_t c0,
                      int64_t L, int64_t bs) {
  if (kpm)
    for (int64_t t = 0; t < bs; ++t) si[t] += kpm[c0 + t];
  if (am)
    for (int64_t t = 0; t < bs; ++t) si[t] += am[i * L + c0 + t];
}

void attend_block_row(const float* q, const float* k, const float* v, const int64_t* cols,
                      const uint8_t* keep, const float* kpm, const float* am, float* out,
                      float* lse, int64_t L, int64_t D,
                      int64_t bs, int64_t W, float scale, float* qs, float* kt, float* s,
                      float* acc, float* m, float* l) {
  // q, out: this block row's [bs, D]; k, v: this (batch, head)'s [L, D]; lse: [bs]
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < bs * D; ++i) qs[i] = q[i] * scale;
  for (int64_t i = 0; i < bs * D; ++i) acc[i] = 0.0f;
  for (int64_t i = 0; i < bs; ++i) {
    m[i] = neg_inf;
    l[i] = 0.0f;
  }
  for (int64_t j = 0; j < W; ++j) {
    if (!keep[j]) continue;
    const float* kb = k + cols[j] * bs * D;
    const float* vb = v + cols[j] * bs * D;
    for (int64_t t = 0; t < bs; ++t)  // kt[d][t] = kb[t][d]
      for (int64_t d = 0; d < D; ++d) kt[d * bs + t] = kb[t * D + d];
    for (int64_t i = 0; i < bs; ++i) {
      float* si = s + i * bs;
      for (int64_t t = 0; t < bs; ++t) si[t] = 0.0f;
      const float* qi = qs + i * D;
      for (int64_t d = 0; d < D; ++d) {
        const float qd = qi[d];
        const float* kd = kt + d * bs;
#pragma omp simd
        for (int64_t t = 0; t < bs; ++t) si[t] += qd * kd[t];
      }
      add_masks(si, kpm, am, i, cols[j] * bs, L, bs);
      float mx = m[i];
      for (int64_t t = 0; t < bs; ++t) mx = si[t] > mx ? si[t] : mx;
      if (mx == neg_inf) continue;  // every key so far masked: nothing to add
      const float corr = std::exp(m[i] - mx);
      float total = 0.0f;
      for (int64_t t = 0; t < bs; ++t) {
        si[t] = std::exp(si[t] - mx);
        total += si[t];
      }
      l[i] = l[i] * corr + total;
      m[i] = mx;
      float* ai = acc + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ai[d] *= corr;
      for (int64_t t = 0; t < bs; ++t) {
        const float p = si[t];
        const float* vt = vb + t * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ai[d] += p * vt[d];
      }
    }
  }
  for (int64_t i = 0; i < bs; ++i) {
    float* oi = out + i * D;
    const float* ai = acc + i * D;
    if (l[i] > 0.0f) {
      const float inv = 1.0f / l[i];
      for (int64_t d = 0; d < D; ++d) oi[d] = ai[d] * inv;
      lse[i] = m[i] + std::log(l[i]);
    } else {
      for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
      lse[i] = std::numeric_limits<float>::infinity();
    }
  }
}

void backward_pair(const float* q, const float* k, const float* v, const float* out,
                   const float* lse, const float* dout, const int64_t* cols, const uint8_t* keep,
                   const float* kpm, const float* am, float* dq, float* dk, float* dv, int64_t L, int64_t D, int64_t bs,
                   int64_t group, int64_t W, float scale, int64_t h, int64_t ng) {
  // one (batch, head): q.. dv point at its [L, D]; lse at its [L]; cols/keep: the whole table
  std::vector<float> qs(bs * D), kt(bs * D), vt(bs * D), p(bs * bs), ds(bs * bs), delta(bs);
  const int64_t n = L / bs;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t g = r / group, rb = r % group;
    const int64_t* rc = cols + (h * ng + g) * W;
    const uint8_t* rk = keep + ((h * ng + g) * group + rb) * W;
    const float* qr = q + r * bs * D;
    const float* dor = dout + r * bs * D;
    const float* orow = out + r * bs * D;
    const float* lr = lse + r * bs;
    float* dqr = dq + r * bs * D;
    for (int64_t i = 0; i < bs * D; ++i) qs[i] = qr[i] * scale;
    for (int64_t i = 0; i < bs; ++i) {
      float acc = 0.0f;
      for (int64_t d = 0; d < D; ++d) acc += dor[i * D + d] * orow[i * D + d];
      delta[i] = acc;
    }
    for (int64_t j = 0; j < W; ++j) {
      if (!rk[j]) continue;
      const int64_t c = rc[j];
      const float* kb = k + c * bs * D;
      const float* vb = v + c * bs * D;
      float* dkb = dk + c * bs * D;
      float* dvb = dv + c * bs * D;
      for (int64_t t = 0; t < bs; ++t)
        for (int64_t d = 0; d < D; ++d) {
          kt[d * bs + t] = kb[t * D + d];
          vt[d * bs + t] = vb[t * D + d];
        }
      for (int64_t i = 0; i < bs; ++i) {
        float* pi = p.data() + i * bs;
        float* dsi = ds.data() + i * bs;
        for (int64_t t = 0; t < bs; ++t) pi[t] = dsi[t] = 0.0f;
        const float* qi = qs.data() + i * D;
        const float* doi = dor + i * D;
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qi[d], dd = doi[d];
          const float* kd = kt.data() + d * bs;
          const float* vd = vt.data() + d * bs;
#pragma omp simd
          for (int64_t t = 0; t < bs; ++t) {
            pi[t] += qd * kd[t];
            dsi[t] += dd * vd[t];
          }
        }
        add_masks(pi, kpm, am ? am + r * bs * L : nullptr, i, c * bs, L, bs);
        for (int64_t t = 0; t < bs; ++t) {
          pi[t] = std::exp(pi[t] - lr[i]);
          dsi[t] = pi[t] * (dsi[t] - delta[i]);
        }
        float* dqi = dqr + i * D;
        for (int64_t t = 0; t < bs; ++t) {
          const float w = dsi[t] * scale;
          const float* kr = kb + t * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) dqi[d] += w * kr[d];
        }
      }
      for (int64_t t = 0; t < bs; ++t) {
        float* dkt = dkb + t * D;
        float* dvt = dvb + t * D;
        for (int64_t i = 0; i < bs; ++i) {
          const float w = ds[i * bs + t], pw = p[i * bs + t];
          const float* qi = qs.data() + i * D;
          const float* doi = dor + i * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) {
            dkt[d] += w * qi[d];
            dvt[d] += pw * doi[d];
          }
        }
      }
    }
  }
}

}  // namespace

static PyObject* backward(PyObject*, PyObject* args) {
  unsigned long long qp, kp, vp, op, lp, gp, cp, keepp, kpmp, amp, dqp, dkp, dvp;
  long long B, H, L, D, bs, group, W;
  double scale;
  int nthreads;
  if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKKLLLLLLLdi", &qp, &kp, &vp, &op, &lp, &gp, &cp, &keepp,
                        &kpmp, &amp, &dqp, &dkp, &dvp, &B, &H, &L, &D, &bs, &group, &W, &scale,
                        &nthreads))
    return nullptr;
  if (bs <= 0 || group <= 0 || L % (bs * group) != 0 || D <= 0 || W <= 0) {
    PyErr_SetString(PyExc_ValueError, "block_sparse_attn: L must be a multiple of block * group");
    return nullptr;
  }
  const float* q = reinterpret_cast<const float*>(qp);
  const float* k = reinterpret_cast<const float*>(kp);
  const float* v = reinterpret_cast<const float*>(vp);
  const float* out = reinterpret_cast<const float*>(op);
  const float* lse = reinterpret_cast<const float*>(lp);
  const float* dout = reinterpret_cast<const float*>(gp);
  const int64_t* cols = reinterpret_cast<const int64_t*>(cp);
  const uint8_t* keep = reinterpret_cast<const uint8_t*>(keepp);
  float* dq = reinterpret_cast<float*>(dqp);
  float* dk = reinterpret_cast<float*>(dkp);
  float* dv = reinterpret_cast<float*>(dvp);
  const int64_t ng = L / bs / group, pairs = B * H;
  const float sc = static_cast<float>(scale);
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t base = bh * L * D;
    const float* kpm = kpmp ? reinterpret_cast<const float*>(kpmp) + (bh / H) * L : nullptr;
    backward_pair(q + base, k + base, v + base, out + base, lse + bh * L, dout + base, cols, keep,
                  kpm, reinterpret_cast<const float*>(amp), dq + base, dk + base, dv + base, L,
                  D, bs, group, W, sc, bh % H, ng);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* forward(PyObject*, PyObject* args) {
  unsigned long long qp, kp, vp, cp, keepp, kpmp, amp, op, lp;
  long long B, H, L, D, bs, group, W;
  double scale;
  int nthreads;
  if (!PyArg_ParseTuple(args, "KKKKKKKKKLLLLLLLdi", &qp, &kp, &vp, &cp, &keepp, &kpmp, &amp, &op,
                        &lp, &B, &H, &L, &D, &bs, &group, &W, &scale, &nthreads))
    return nullptr;
  if (bs <= 0 || group <= 0 || L % (bs * group) != 0 || D <= 0 || W <= 0) {
    PyErr_SetString(PyExc_ValueError, "block_sparse_attn: L must be a multiple of block * group");
    return nullptr;
  }
  const float* q = reinterpret_cast<const float*>(qp);
  const float* k = reinterpret_cast<const float*>(kp);
  const float* v = reinterpret_cast<const float*>(vp);
  const int64_t* cols = reinterpret_cast<const int64_t*>(cp);
  const uint8_t* keep = reinterpret_cast<const uint8_t*>(keepp);
  float* out = reinterpret_cast<float*>(op);
  float* lse = reinterpret_cast<float*>(lp);
  const int64_t n = L / bs, ng = n / group, units = B * H * n;
  const float sc = static_cast<float>(scale);
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> qs(bs * D), kt(bs * D), s(bs * bs), acc(bs * D), m(bs), l(bs);
#pragma omp for schedule(dynamic, 4)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t bh = u / n, r = u % n, h = bh % H, g = r / group, rb = r % group;
      const int64_t base = bh * L * D;
      const float* kpm = kpmp ? reinterpret_cast<const float*>(kpmp) + (bh / H) * L : nullptr;
      const float* am = amp ? reinterpret_cast<const float*>(amp) + r * bs * L : nullptr;
      attend_block_row(q + base + r * bs * D, k + base, v + base, cols + (h * ng + g) * W,
                       keep + ((h * ng + g) * group + rb) * W, kpm, am, out + base + r * bs * D,
                       lse + bh * L + r * bs, L, D, bs, W, sc, qs.data(), kt.data(), s.data(),
                       acc.data(), m.data(), l.data());
    }
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "block-sparse attention forward (OpenMP, SIMD)",
                   {"forward", forward, METH_VARARGS,
                    "q, k, v [B, H, L, D] fp32 + the layout table -> out, lse"},
                   {"backward", backward, METH_VARARGS,
                    "q, k, v, out, lse, dout + the layout table -> dq, dk, dv"})
