// Op "cuda_onebit": Python binding of the 1-bit pack/unpack kernels (onebit.cu).
#include "py_cuda.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cuda_onebit
#endif

// pack(x_ptr, error_ptr, bits_ptr, scales_ptr, n, block, stream)
static PyObject* pack(PyObject*, PyObject* args) {
  unsigned long long x, e, b, s, stream;
  long long n;
  int block;
  if (!PyArg_ParseTuple(args, "KKKKLiK", &x, &e, &b, &s, &n, &block, &stream)) return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::onebit_pack(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(e),
                                 reinterpret_cast<uint8_t*>(b), reinterpret_cast<float*>(s), n,
                                 block, reinterpret_cast<cudaStream_t>(stream)),
      "onebit_pack");
}

// unpack(bits_ptr, scales_ptr, out_ptr, n, block, alpha, accumulate, stream)
static PyObject* unpack(PyObject*, PyObject* args) {
  unsigned long long b, s, o, stream;
  long long n;
  int block, accumulate;
  double alpha;
  if (!PyArg_ParseTuple(args, "KKKLidpK", &b, &s, &o, &n, &block, &alpha, &accumulate, &stream))
    return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::onebit_unpack(reinterpret_cast<const uint8_t*>(b),
                                   reinterpret_cast<const float*>(s), reinterpret_cast<float*>(o),
                                   n, block, float(alpha), accumulate,
                                   reinterpret_cast<cudaStream_t>(stream)),
      "onebit_unpack");
}

DSLAUNCH_CUDA_MODULE(TORCH_EXTENSION_NAME, "1-bit sign compression with error feedback (CUDA)",
                     {"pack", pack, METH_VARARGS, "signs + per-block scales, error feedback"},
                     {"unpack", unpack, METH_VARARGS, "decode (optionally accumulate) signs"})
