// Op "cpu_membw": STREAM-style memory bandwidth probes for the benchmarks (copy a=b, triad
// a=b+s*c, read sum(a)), OpenMP static split + the build's SIMD level, so the optimizer figures can
// be set against what the machine moves with the same threads. Counted bytes follow STREAM: copy
// 8 B/element, triad 12 B/element, read 4 B/element (write-allocate traffic is not counted).
// adam_traffic (a += d, b += d, c += d) moves exactly what an fp32 Adam step moves, 28 B/element
// over four read and three write streams, with no arithmetic to speak of: the ceiling an Adam
// kernel can reach with these threads. With 1-2 threads the STREAM probes are bound by how many
// misses one stream keeps in flight, not by the memory, so they sit below it.
#include <utility>

#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_membw
#endif

namespace {

// The calling thread's share [lo, hi) of n elements inside a parallel region: one contiguous,
// 64-element-aligned slice per thread (all of it outside one).
std::pair<int64_t, int64_t> thread_range(int64_t n) {
#ifdef _OPENMP
  const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t per = ((n + nt - 1) / nt + 63) & ~int64_t(63);
  const int64_t lo = std::min(n, t * per);
  return {lo, std::min(n, lo + per)};
#else
  return {0, n};
#endif
}

// f captures by value and each thread calls its own copy, so the pointers stay in registers
// across the SIMD stores (which may alias anything; see elementwise in cpu_optim.h).
template <class F>
void static_split(int64_t n, int nthreads, const F& f) {
  (void)nthreads;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads)
#endif
  {
    const F body = f;
    const auto [lo, hi] = thread_range(n);
    body(lo, hi);
  }
}

using dslaunch::ScalarOps;
using dslaunch::VecOps;

}  // namespace

// copy(dst, src, n, nthreads); triad(a, b, c, scalar, n, nthreads); read(a, n, nthreads) -> float;
// adam_traffic(a, b, c, d, n, nthreads)
static PyObject* copy(PyObject*, PyObject* args) {
  unsigned long long a, b;
  long long n;
  int nt;
  if (!PyArg_ParseTuple(args, "KKLi", &a, &b, &n, &nt)) return nullptr;
  float* A = reinterpret_cast<float*>(a);
  const float* B = reinterpret_cast<const float*>(b);
  Py_BEGIN_ALLOW_THREADS
  static_split(n, nt, [=](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + VecOps::W <= hi; i += VecOps::W) VecOps::store(A + i, VecOps::load(B + i));
    for (; i < hi; ++i) A[i] = B[i];
  });
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* triad(PyObject*, PyObject* args) {
  unsigned long long a, b, c;
  double s;
  long long n;
  int nt;
  if (!PyArg_ParseTuple(args, "KKKdLi", &a, &b, &c, &s, &n, &nt)) return nullptr;
  float* A = reinterpret_cast<float*>(a);
  const float* B = reinterpret_cast<const float*>(b);
  const float* C = reinterpret_cast<const float*>(c);
  const float sf = float(s);
  Py_BEGIN_ALLOW_THREADS
  static_split(n, nt, [=](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + VecOps::W <= hi; i += VecOps::W)
      VecOps::store(A + i, VecOps::fma(VecOps::set1(sf), VecOps::load(C + i), VecOps::load(B + i)));
    for (; i < hi; ++i) A[i] = ScalarOps::fma(sf, C[i], B[i]);
  });
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* adam_traffic(PyObject*, PyObject* args) {
  unsigned long long a, b, c, d;
  long long n;
  int nt;
  if (!PyArg_ParseTuple(args, "KKKKLi", &a, &b, &c, &d, &n, &nt)) return nullptr;
  float* A = reinterpret_cast<float*>(a);
  float* B = reinterpret_cast<float*>(b);
  float* C = reinterpret_cast<float*>(c);
  const float* D = reinterpret_cast<const float*>(d);
  Py_BEGIN_ALLOW_THREADS
  static_split(n, nt, [=](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + VecOps::W <= hi; i += VecOps::W) {
      const auto x = VecOps::load(D + i);
      VecOps::store(A + i, VecOps::add(VecOps::load(A + i), x));
      VecOps::store(B + i, VecOps::add(VecOps::load(B + i), x));
      VecOps::store(C + i, VecOps::add(VecOps::load(C + i), x));
    }
    for (; i < hi; ++i) {
      A[i] += D[i];
      B[i] += D[i];
      C[i] += D[i];
    }
  });
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* read(PyObject*, PyObject* args) {
  unsigned long long a;
  long long n;
  int nt;
  if (!PyArg_ParseTuple(args, "KLi", &a, &n, &nt)) return nullptr;
  const float* A = reinterpret_cast<const float*>(a);
  double total = 0;
  Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : total)
#endif
  {
    const auto [lo, hi] = thread_range(n);
    // four accumulators: one add chain would cap a core at one vector per add latency
    VecOps::V acc[4] = {VecOps::set1(0.f), VecOps::set1(0.f), VecOps::set1(0.f), VecOps::set1(0.f)};
    int64_t i = lo;
    for (; i + 4 * VecOps::W <= hi; i += 4 * VecOps::W)
      for (int k = 0; k < 4; ++k) acc[k] = VecOps::add(acc[k], VecOps::load(A + i + k * VecOps::W));
    for (; i + VecOps::W <= hi; i += VecOps::W) acc[0] = VecOps::add(acc[0], VecOps::load(A + i));
    double part = 0;
    for (const auto& a : acc) {
      float lanes[64];
      std::memcpy(lanes, &a, sizeof(a));
      for (int k = 0; k < VecOps::W; ++k) part += lanes[k];
    }
    for (; i < hi; ++i) part += A[i];
    total += part;
  }
  Py_END_ALLOW_THREADS
  return PyFloat_FromDouble(total);
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "STREAM-style bandwidth probes (SIMD + OpenMP)",
                   {"copy", copy, METH_VARARGS, "a = b"},
                   {"triad", triad, METH_VARARGS, "a = b + s * c"},
                   {"read", read, METH_VARARGS, "sum(a)"},
                   {"adam_traffic", adam_traffic, METH_VARARGS, "a += d; b += d; c += d"})
