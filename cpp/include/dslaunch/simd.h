// SIMD vocabulary for the CPU optimizer kernels: one "vector of floats" type per instruction set.
//
// The build picks exactly one level with a macro set by dslaunch/kernels/builder.py:
//   DSLAUNCH_SIMD_AVX512 (-mavx512f -mavx512bw ...), DSLAUNCH_SIMD_AVX2 (-mavx2 -mfma),
//   otherwise scalar (also used on aarch64, where -O3 auto-vectorises the scalar loop for NEON).
// VecOps works on W floats at a time; ScalarOps on one float with the same operation sequence, so
// the tail of an array (n % W elements) is rounded exactly like its body.
// bf16 values are uint16_t bit patterns; float -> bf16 is round-to-nearest-even computed on the
// integer bits (the rule torch's c10::BFloat16 uses, denormals included), NaN stays a quiet NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(DSLAUNCH_SIMD_AVX512) || defined(DSLAUNCH_SIMD_AVX2)
#include <immintrin.h>
#endif

namespace dslaunch {

using bf16_t = uint16_t;

inline float bf16_to_f32(bf16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_t>(u >> 16);
}

// One float at a time. fma is a hardware fused multiply-add where the level has one (so tails
// match the vector body); the scalar level has none and uses a*b+c (built with -ffp-contract=off).
struct ScalarOps {
  using V = float;
  static constexpr int W = 1;
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static V load(const bf16_t* p) { return bf16_to_f32(*p); }
  static void store(float* p, V x) { *p = x; }
  static void store(bf16_t* p, V x) { *p = f32_to_bf16(x); }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V sqrt(V a) { return std::sqrt(a); }
#if defined(__FMA__)
  static V fma(V a, V b, V c) { return __builtin_fmaf(a, b, c); }
#else
  static V fma(V a, V b, V c) { return a * b + c; }
#endif
  // sign(x) * s: +s, -s, or 0 for x == 0 (NaN gives 0, like torch.sign(nan) * s would not: NaN
  // gradients are the caller's problem; DeepSpeed's kernels behave the same).
  static V signmul(V x, V s) { return x > 0.f ? s : (x < 0.f ? -s : 0.f); }
};

#if defined(DSLAUNCH_SIMD_AVX512)
#define DSLAUNCH_SIMD_NAME "avx512"
struct VecOps {
  using V = __m512;
  static constexpr int W = 16;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const bf16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static void store(bf16_t* p, V x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(nan, r, qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V signmul(V x, V s) {
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    V r = _mm512_mask_blend_ps(pos, _mm512_setzero_ps(), s);
    return _mm512_mask_blend_ps(neg, r, _mm512_sub_ps(_mm512_setzero_ps(), s));
  }
};
#elif defined(DSLAUNCH_SIMD_AVX2)
#define DSLAUNCH_SIMD_NAME "avx2"
struct VecOps {
  using V = __m256;
  static constexpr int W = 8;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const bf16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static void store(bf16_t* p, V x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, nan);
    // values are <= 0xffff, so unsigned saturation keeps them; packus works per 128-bit lane
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V signmul(V x, V s) {
    V zero = _mm256_setzero_ps();
    V r = _mm256_blendv_ps(zero, s, _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
    return _mm256_blendv_ps(r, _mm256_sub_ps(zero, s), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
  }
};
#else
#define DSLAUNCH_SIMD_NAME "scalar"
using VecOps = ScalarOps;
#endif

}  // namespace dslaunch
