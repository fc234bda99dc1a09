// Op "cuda_fused_adam": Python binding of dslaunch_cuda::fused_adam (fused_adam.cu).
#include <vector>

#include "py_cuda.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cuda_fused_adam
#endif

// adam(tensors, param_dtype, grad_dtype, copy_dtype, lr, beta1, beta2, eps, weight_decay, step,
//      adamw, bias_correction, grad_scale, stream); tensors: sequence of
//      (param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, copy_ptr or 0, numel)
static PyObject* adam(PyObject*, PyObject* args) {
  PyObject* seq;
  int pdt, gdt, cdt, adamw, bias;
  double lr, b1, b2, eps, wd, gs;
  long long step;
  unsigned long long stream;
  if (!PyArg_ParseTuple(args, "OiiidddddLppdK", &seq, &pdt, &gdt, &cdt, &lr, &b1, &b2, &eps, &wd,
                        &step, &adamw, &bias, &gs, &stream))
    return nullptr;
  PyObject* fast = PySequence_Fast(seq, "tensors must be a sequence of 6-tuples");
  if (!fast) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  std::vector<dslaunch_cuda::AdamTensor> ts(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    unsigned long long p, g, m, v, c;
    long long numel;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "KKKKKL", &p, &g, &m, &v, &c, &numel)) {
      Py_DECREF(fast);
      return nullptr;
    }
    ts[i] = {reinterpret_cast<void*>(p), reinterpret_cast<const void*>(g),
             reinterpret_cast<float*>(m), reinterpret_cast<float*>(v), reinterpret_cast<void*>(c),
             static_cast<int64_t>(numel)};
  }
  Py_DECREF(fast);
  const dslaunch_cuda::AdamArgs a{lr, b1, b2, eps, wd, step, adamw, bias, gs};
  cudaError_t err;
  Py_BEGIN_ALLOW_THREADS
  err = dslaunch_cuda::fused_adam(ts.data(), static_cast<int>(n), pdt, gdt, cdt, a,
                                  reinterpret_cast<cudaStream_t>(stream));
  Py_END_ALLOW_THREADS
  return dslaunch_cuda_result(err, "fused_adam");
}

DSLAUNCH_CUDA_MODULE(TORCH_EXTENSION_NAME, "fused multi-tensor Adam/AdamW (CUDA)",
                     {"adam", adam, METH_VARARGS, "one Adam/AdamW step over a list of tensors"})
