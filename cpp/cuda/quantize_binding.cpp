// Op "cuda_quantize": Python binding of the block-wise int8/int4 quantization kernels
// (quantize.cu); the same calls as the CPU op cpu_quantize, with the stream in place of nthreads.
#include "py_cuda.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cuda_quantize
#endif

// quantize(x_ptr, dtype, n, block, bits, q_ptr, scales_ptr, stream)
static PyObject* quantize(PyObject*, PyObject* args) {
  unsigned long long x, q, s, stream;
  long long n, block;
  int dtype, bits;
  if (!PyArg_ParseTuple(args, "KiLLiKKK", &x, &dtype, &n, &block, &bits, &q, &s, &stream))
    return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::quantize_blocks(reinterpret_cast<const void*>(x), dtype, n, block, bits,
                                     reinterpret_cast<uint8_t*>(q), reinterpret_cast<float*>(s),
                                     reinterpret_cast<cudaStream_t>(stream)),
      "quantize");
}

// dequantize(q_ptr, scales_ptr, n, block, bits, out_ptr, dtype, accumulate, stream)
static PyObject* dequantize(PyObject*, PyObject* args) {
  unsigned long long q, s, o, stream;
  long long n, block;
  int bits, dtype, accumulate;
  if (!PyArg_ParseTuple(args, "KKLLiKiiK", &q, &s, &n, &block, &bits, &o, &dtype, &accumulate,
                        &stream))
    return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::dequantize_blocks(reinterpret_cast<const uint8_t*>(q),
                                       reinterpret_cast<const float*>(s), n, block, bits,
                                       reinterpret_cast<void*>(o), dtype, accumulate,
                                       reinterpret_cast<cudaStream_t>(stream)),
      "dequantize");
}

DSLAUNCH_CUDA_MODULE(TORCH_EXTENSION_NAME, "block-wise symmetric int8/int4 quantization (CUDA)",
                     {"quantize", quantize, METH_VARARGS, "fp32/bf16 -> int8/int4 + fp32 scales"},
                     {"dequantize", dequantize, METH_VARARGS, "int8/int4 + scales -> fp32/bf16"})
