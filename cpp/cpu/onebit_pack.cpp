// Op "onebit_pack": the CPU side of the error-compensated 1-bit all-reduce
// (dslaunch/engine/optim/onebit/compressed.py, which holds the torch fallback these must equal).
//
// Wire layout: blocks of `block` fp32 values are grouped in rows of `row_blocks` blocks; a row is
// `row_blocks * block / 8` bytes of signs (element 8i+k in bit k of byte i, 1 = non-negative)
// followed by `row_blocks` fp32 scales (memcpy'd: a row's sign bytes need not be a multiple of 4).
//
// pack(x, err, n_valid, nblocks, block, out, row_blocks, row_bytes, nthreads):
//   c = x + err over the first n_valid values (later positions count as 0); per block
//   scale = ||c||_2 / sqrt(valid values in the block) (0 for a block with none); bits = c >= 0;
//   err = c - (bit ? scale : -scale) on valid positions, 0 on the others (padding never carries
//   error). x holds n_valid values, err nblocks * block.
// decode(in, nrows, row_bytes, row_blocks, block, out, n_out, alpha, sum_rows, nthreads):
//   sum_rows = 1: out[i] = alpha * sum over rows of row_r's value i   (i < min(row, n_out))
//   sum_rows = 0: out[r * row + i] = alpha * row_r's value i         (index < n_out)
//   with row = row_blocks * block values per row.
// clamp(m, denom, n, bound, nthreads): m = clamp(m, -denom * bound, denom * bound), and 0 where
//   denom is +inf (a coordinate that never had a gradient;
//   see dslaunch/engine/optim/onebit/optimizer.py).
// One block (8 KB at the default 2048) stays in L1 between the norm and the sign pass, so each
// call reads and writes its arrays once. OpenMP over blocks.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME onebit_pack
#endif

namespace {

inline float scale_at(const uint8_t* row, int64_t sign_bytes, int64_t b) {
  float s;
  std::memcpy(&s, row + sign_bytes + 4 * b, 4);
  return s;
}

void pack_block(const float* x, float* e, int64_t valid, int64_t block, uint8_t* bits,
                float* scale_out) {
  // c = x + e, kept in e; sum of squares in double (8 lanes: the compiler may vectorise)
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= valid; i += 8)
    for (int k = 0; k < 8; ++k) {
      const float c = x[i + k] + e[i + k];
      e[i + k] = c;
      acc[k] += double(c) * double(c);
    }
  for (; i < valid; ++i) {
    const float c = x[i] + e[i];
    e[i] = c;
    acc[0] += double(c) * double(c);
  }
  double sq = 0;
  for (int k = 0; k < 8; ++k) sq += acc[k];
  const float scale = valid > 0 ? float(std::sqrt(sq) / std::sqrt(double(valid))) : 0.0f;
  *scale_out = scale;
  for (int64_t byte = 0; byte < block / 8; ++byte) {
    uint8_t v = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t j = byte * 8 + k;
      if (j < valid) {
        const float c = e[j];
        const bool pos = c >= 0.0f;
        v |= uint8_t(pos) << k;
        e[j] = c - (pos ? scale : -scale);
      } else {
        v |= uint8_t(1) << k;  // padding is 0, whose sign bit is 1
        e[j] = 0.0f;
      }
    }
    bits[byte] = v;
  }
}

// SIGNS[b][k] = +1 if bit k of byte b is set, else -1: decoding 8 values is one row load and
// one multiply (vectorised by the compiler), no per-bit branch.
struct SignTable {
  alignas(32) float v[256][8];
  SignTable() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) v[b][k] = (b >> k) & 1 ? 1.0f : -1.0f;
  }
};
const SignTable SIGNS;

inline void decode_block(const uint8_t* bits, float scale, int64_t count, float alpha, bool add,
                         float* out) {
  const float s = alpha * scale;
  const int64_t whole = count / 8;
  if (add) {
    for (int64_t byte = 0; byte < whole; ++byte) {
      const float* t = SIGNS.v[bits[byte]];
      float* o = out + 8 * byte;
      for (int k = 0; k < 8; ++k) o[k] += t[k] * s;
    }
  } else {
    for (int64_t byte = 0; byte < whole; ++byte) {
      const float* t = SIGNS.v[bits[byte]];
      float* o = out + 8 * byte;
      for (int k = 0; k < 8; ++k) o[k] = t[k] * s;
    }
  }
  for (int64_t j = 8 * whole; j < count; ++j) {
    const float v = SIGNS.v[bits[j >> 3]][j & 7] * s;
    out[j] = add ? out[j] + v : v;
  }
}

}  // namespace

static PyObject* pack(PyObject*, PyObject* args) {
  unsigned long long xp, ep, op;
  long long n_valid, nblocks, block, row_blocks, row_bytes;
  int nthreads;
  if (!PyArg_ParseTuple(args, "KKLLLKLLi", &xp, &ep, &n_valid, &nblocks, &block, &op, &row_blocks,
                        &row_bytes, &nthreads))
    return nullptr;
  if (block <= 0 || block % 8 || row_blocks <= 0 || nblocks % row_blocks) {
    PyErr_SetString(PyExc_ValueError, "onebit_pack.pack: block must be a positive multiple of 8 "
                                      "and nblocks a multiple of row_blocks");
    return nullptr;
  }
  const float* x = reinterpret_cast<const float*>(xp);
  float* e = reinterpret_cast<float*>(ep);
  uint8_t* out = reinterpret_cast<uint8_t*>(op);
  const int64_t sign_bytes = row_blocks * block / 8;
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t start = b * block;
    int64_t valid = n_valid - start;
    valid = valid < 0 ? 0 : (valid > block ? block : valid);
    uint8_t* row = out + (b / row_blocks) * row_bytes;
    const int64_t rb = b % row_blocks;
    float scale;
    pack_block(x + start, e + start, valid, block, row + rb * (block / 8), &scale);
    std::memcpy(row + sign_bytes + 4 * rb, &scale, 4);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* decode(PyObject*, PyObject* args) {
  unsigned long long ip, op;
  long long nrows, row_bytes, row_blocks, block, n_out;
  double alpha;
  int sum_rows, nthreads;
  if (!PyArg_ParseTuple(args, "KLLLLKLdii", &ip, &nrows, &row_bytes, &row_blocks, &block, &op,
                        &n_out, &alpha, &sum_rows, &nthreads))
    return nullptr;
  if (block <= 0 || block % 8 || row_blocks <= 0) {
    PyErr_SetString(PyExc_ValueError, "onebit_pack.decode: block must be a positive multiple of 8");
    return nullptr;
  }
  const uint8_t* in = reinterpret_cast<const uint8_t*>(ip);
  float* out = reinterpret_cast<float*>(op);
  const int64_t sign_bytes = row_blocks * block / 8, row = row_blocks * block;
  const float a = float(alpha);
  Py_BEGIN_ALLOW_THREADS
  if (sum_rows) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t b = 0; b < row_blocks; ++b) {
      int64_t count = n_out - b * block;
      count = count < 0 ? 0 : (count > block ? block : count);
      for (int64_t r = 0; r < nrows; ++r) {
        const uint8_t* src = in + r * row_bytes;
        decode_block(src + b * (block / 8), scale_at(src, sign_bytes, b), count, a, r > 0,
                     out + b * block);
      }
    }
  } else {
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < nrows * row_blocks; ++g) {
      const int64_t r = g / row_blocks, b = g % row_blocks, start = r * row + b * block;
      int64_t count = n_out - start;
      count = count < 0 ? 0 : (count > block ? block : count);
      const uint8_t* src = in + r * row_bytes;
      decode_block(src + b * (block / 8), scale_at(src, sign_bytes, b), count, a, false,
                   out + start);
    }
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* clamp(PyObject*, PyObject* args) {
  unsigned long long mp, dp;
  long long n;
  double bound;
  int nthreads;
  if (!PyArg_ParseTuple(args, "KKLdi", &mp, &dp, &n, &bound, &nthreads)) return nullptr;
  float* m = reinterpret_cast<float*>(mp);
  const float* d = reinterpret_cast<const float*>(dp);
  const float b = float(bound);
  Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t i = 0; i < n; ++i) {
    const float lim = d[i] * b, v = m[i];
    const float c = v < -lim ? -lim : (v > lim ? lim : v);
    m[i] = std::isinf(d[i]) ? 0.0f : c;
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "1-bit sign pack with error feedback, and decode (OpenMP)",
                   {"pack", pack, METH_VARARGS, "error-compensated sign compression into rows"},
                   {"decode", decode, METH_VARARGS, "decode (and sum) rows of signs + scales"},
                   {"clamp", clamp, METH_VARARGS, "clamp a momentum to +-denom * bound"})
