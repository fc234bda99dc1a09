// Op "cpu_adam": Adam / AdamW step over one flat array (see dslaunch/cpu_optim.h).
#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_adam
#endif

// adam(param, param_dtype, grad, grad_dtype, exp_avg, exp_avg_sq, copy, copy_dtype, n,
//      lr, beta1, beta2, eps, weight_decay, step, adamw, bias_correction, grad_scale, nthreads)
static PyObject* adam(PyObject*, PyObject* args) {
  unsigned long long p, g, m, v, c;
  int pdt, gdt, cdt, adamw, bias_correction, nthreads;
  long long n, step;
  double lr, beta1, beta2, eps, wd, grad_scale;
  if (!PyArg_ParseTuple(args, "KiKiKKKiLdddddLppdi", &p, &pdt, &g, &gdt, &m, &v, &c, &cdt, &n, &lr,
                        &beta1, &beta2, &eps, &wd, &step, &adamw, &bias_correction, &grad_scale,
                        &nthreads))
    return nullptr;
  const dslaunch::AdamArgs a{lr, beta1, beta2, eps, wd, step, adamw != 0, bias_correction != 0,
                             grad_scale};
  bool ok;
  Py_BEGIN_ALLOW_THREADS
  ok = dslaunch::dispatch_dtypes(pdt, gdt, cdt, p, g, c, [&](auto* pp, auto* gp, auto* cp) {
    dslaunch::adam_kernel(pp, gp, reinterpret_cast<float*>(m), reinterpret_cast<float*>(v), cp, n, a,
                          nthreads);
  });
  Py_END_ALLOW_THREADS
  if (!ok) return dslaunch::bad_dtypes(pdt, gdt, cdt);
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "Adam/AdamW CPU step (SIMD + OpenMP)",
                   {"adam", adam, METH_VARARGS, "one Adam/AdamW step over a flat array"})
