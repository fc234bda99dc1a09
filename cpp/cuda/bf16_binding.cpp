// Op "cuda_bf16": Python binding of the fp32 <-> bf16 kernels (bf16_convert.cu).
#include "py_cuda.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cuda_bf16
#endif

static PyObject* to_bf16(PyObject*, PyObject* args) {
  unsigned long long in, out, stream;
  long long n;
  if (!PyArg_ParseTuple(args, "KKLK", &in, &out, &n, &stream)) return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::f32_to_bf16(reinterpret_cast<const float*>(in),
                                 reinterpret_cast<dslaunch_cuda::bf16_t*>(out), n,
                                 reinterpret_cast<cudaStream_t>(stream)),
      "f32_to_bf16");
}

static PyObject* to_f32(PyObject*, PyObject* args) {
  unsigned long long in, out, stream;
  long long n;
  if (!PyArg_ParseTuple(args, "KKLK", &in, &out, &n, &stream)) return nullptr;
  return dslaunch_cuda_result(
      dslaunch_cuda::bf16_to_f32(reinterpret_cast<const dslaunch_cuda::bf16_t*>(in),
                                 reinterpret_cast<float*>(out), n,
                                 reinterpret_cast<cudaStream_t>(stream)),
      "bf16_to_f32");
}

DSLAUNCH_CUDA_MODULE(TORCH_EXTENSION_NAME, "fp32 <-> bf16 conversion (CUDA)",
                     {"to_bf16", to_bf16, METH_VARARGS, "fp32 -> bf16, round to nearest even"},
                     {"to_f32", to_f32, METH_VARARGS, "bf16 -> fp32"})
