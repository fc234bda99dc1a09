// Op "cpu_quantize": block-wise symmetric int8 / int4 quantization for ZeRO++ (qwZ weights, qgZ
// gradients; dslaunch/kernels/quantize.py holds the torch reference these must equal bit for bit).
//
// x (n values, fp32 or bf16) is cut into blocks of `block` values (the last may be shorter);
// per block scale = max|x| / qmax (qmax = 127 for int8, 7 for int4; fp32 division) and
// q = clamp(round_half_even(x / scale), -qmax, qmax), q = 0 in a block whose scale is 0.
// Dequantize: x' = float(q) * scale (fp32, or rounded once to bf16), or out += that.
// So |x - x'| <= scale / 2 up to the rounding of x / scale and of q * scale.
//
// Layout: int8: one byte per value (two's complement). int4: two values per byte, value 2i in
// the low nibble of byte i and 2i+1 in the high nibble (two's complement nibbles, -7..7); an odd
// n leaves the last high nibble 0; `block` must be even so every block starts on a byte.
// scales: one fp32 per block.
//
// quantize(x, dtype, n, block, bits, q, scales, nthreads)       dtype 0 = fp32, 1 = bf16
// dequantize(q, scales, n, block, bits, out, dtype, accumulate, nthreads)  accumulate: fp32 only
// OpenMP over blocks; AVX-512 / AVX2 for the max, the division and rounding and the int8
// conversions, with a scalar tail doing the same IEEE operations (so every level gives the same
// bytes).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_quantize
#endif

namespace {

using dslaunch::bf16_t;
using dslaunch::ScalarOps;
using dslaunch::VecOps;

constexpr int64_t kTile = 256;  // int4 works through an int8 tile of this many values

template <class T>
float block_amax(const T* x, int64_t n) {
  int64_t i = 0;
  float m = 0.0f;
#if defined(DSLAUNCH_SIMD_AVX512)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_abs_ps(VecOps::load(x + i)));
  m = _mm512_reduce_max_ps(acc);
#elif defined(DSLAUNCH_SIMD_AVX2)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_andnot_ps(sign, VecOps::load(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; ++i) {
    const float a = std::fabs(ScalarOps::load(x + i));
    m = a > m ? a : m;
  }
  return m;
}

inline int8_t quant_one(float x, float scale, float qmax) {
  float r = std::nearbyint(x / scale);
  r = r < -qmax ? -qmax : (r > qmax ? qmax : r);
  return static_cast<int8_t>(r);
}

// q[i] = clamp(round(x[i] / scale)), n values; scale > 0
template <class T>
void quant_i8(const T* x, int64_t n, float scale, float qmax, int8_t* q) {
  int64_t i = 0;
#if defined(DSLAUNCH_SIMD_AVX512)
  const __m512 s = _mm512_set1_ps(scale), hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax);
  for (; i + 16 <= n; i += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(VecOps::load(x + i), s),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)));
  }
#elif defined(DSLAUNCH_SIMD_AVX2)
  const __m256 s = _mm256_set1_ps(scale), hi = _mm256_set1_ps(qmax), lo = _mm256_set1_ps(-qmax);
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_div_ps(VecOps::load(x + i), s),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    const __m256i v = _mm256_cvtps_epi32(r);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(w, w));
  }
#endif
  for (; i < n; ++i) q[i] = quant_one(ScalarOps::load(x + i), scale, qmax);
}

// out[i] (=|+=) float(q[i]) * scale
template <class T>
void deq_i8(const int8_t* q, int64_t n, float scale, T* out, bool acc) {
  int64_t i = 0;
#if defined(DSLAUNCH_SIMD_AVX512)
  const __m512 s = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
    if (acc) v = _mm512_add_ps(VecOps::load(out + i), v);
    VecOps::store(out + i, v);
  }
#elif defined(DSLAUNCH_SIMD_AVX2)
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    if (acc) v = _mm256_add_ps(VecOps::load(out + i), v);
    VecOps::store(out + i, v);
  }
#endif
  for (; i < n; ++i) {
    float v = float(q[i]) * scale;
    if (acc) v = ScalarOps::load(out + i) + v;
    ScalarOps::store(out + i, v);
  }
}

template <class T>
void quantize_block(const T* x, int64_t n, int bits, uint8_t* q, float* scale_out) {
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  const float scale = block_amax(x, n) / qmax;
  *scale_out = scale;
  const int64_t nbytes = bits == 8 ? n : (n + 1) / 2;
  if (!(scale > 0.0f)) {  // all zeros (or a max that underflowed): every q is 0
    std::memset(q, 0, nbytes);
    return;
  }
  if (bits == 8) {
    quant_i8(x, n, scale, qmax, reinterpret_cast<int8_t*>(q));
    return;
  }
  int8_t tile[kTile + 1];
  for (int64_t t = 0; t < n; t += kTile) {
    const int64_t m = n - t < kTile ? n - t : kTile;
    quant_i8(x + t, m, scale, qmax, tile);
    tile[m] = 0;  // an odd tail's missing partner
    uint8_t* dst = q + t / 2;
    for (int64_t j = 0; j < (m + 1) / 2; ++j)
      dst[j] = uint8_t((tile[2 * j] & 0x0f) | ((tile[2 * j + 1] & 0x0f) << 4));
  }
}

template <class T>
void dequantize_block(const uint8_t* q, int64_t n, int bits, float scale, T* out, bool acc) {
  if (bits == 8) {
    deq_i8(reinterpret_cast<const int8_t*>(q), n, scale, out, acc);
    return;
  }
  int8_t tile[kTile + 1];
  for (int64_t t = 0; t < n; t += kTile) {
    const int64_t m = n - t < kTile ? n - t : kTile;
    const uint8_t* src = q + t / 2;
    for (int64_t j = 0; j < (m + 1) / 2; ++j) {
      tile[2 * j] = int8_t(uint8_t(src[j] << 4)) >> 4;  // sign-extend the low nibble
      tile[2 * j + 1] = int8_t(src[j]) >> 4;
    }
    deq_i8(tile, m, scale, out + t, acc);
  }
}

bool check(long long n, long long block, int bits) {
  if (bits != 8 && bits != 4) {
    PyErr_Format(PyExc_ValueError, "cpu_quantize: bits must be 8 or 4, got %d", bits);
    return false;
  }
  if (block <= 0 || (bits == 4 && block % 2) || n < 0) {
    PyErr_Format(PyExc_ValueError, "cpu_quantize: block %lld must be positive (even for int4)",
                 block);
    return false;
  }
  return true;
}

}  // namespace

static PyObject* quantize(PyObject*, PyObject* args) {
  unsigned long long xp, qp, sp;
  long long n, block;
  int dtype, bits, nthreads;
  if (!PyArg_ParseTuple(args, "KiLLiKKi", &xp, &dtype, &n, &block, &bits, &qp, &sp, &nthreads))
    return nullptr;
  if (!check(n, block, bits)) return nullptr;
  if (dtype != 0 && dtype != 1) return dslaunch::bad_dtypes(dtype, 0, -1);
  uint8_t* q = reinterpret_cast<uint8_t*>(qp);
  float* scales = reinterpret_cast<float*>(sp);
  const int64_t nblocks = (n + block - 1) / block;
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t start = b * block, count = n - start < block ? n - start : block;
    uint8_t* qb = q + (bits == 8 ? start : start / 2);
    if (dtype == 0)
      quantize_block(reinterpret_cast<const float*>(xp) + start, count, bits, qb, scales + b);
    else
      quantize_block(reinterpret_cast<const bf16_t*>(xp) + start, count, bits, qb, scales + b);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* dequantize(PyObject*, PyObject* args) {
  unsigned long long qp, sp, op;
  long long n, block;
  int bits, dtype, accumulate, nthreads;
  if (!PyArg_ParseTuple(args, "KKLLiKiii", &qp, &sp, &n, &block, &bits, &op, &dtype, &accumulate,
                        &nthreads))
    return nullptr;
  if (!check(n, block, bits)) return nullptr;
  if (dtype != 0 && dtype != 1) return dslaunch::bad_dtypes(dtype, 0, -1);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(qp);
  const float* scales = reinterpret_cast<const float*>(sp);
  const int64_t nblocks = (n + block - 1) / block;
  const bool acc = accumulate != 0;
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t start = b * block, count = n - start < block ? n - start : block;
    const uint8_t* qb = q + (bits == 8 ? start : start / 2);
    if (dtype == 0)
      dequantize_block(qb, count, bits, scales[b], reinterpret_cast<float*>(op) + start, acc);
    else
      dequantize_block(qb, count, bits, scales[b], reinterpret_cast<bf16_t*>(op) + start, acc);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "block-wise symmetric int8/int4 quantization (OpenMP, SIMD)",
                   {"quantize", quantize, METH_VARARGS, "fp32/bf16 -> int8/int4 + fp32 scales"},
                   {"dequantize", dequantize, METH_VARARGS, "int8/int4 + scales -> fp32/bf16"})
