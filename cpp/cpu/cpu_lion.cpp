// Op "cpu_lion": Lion step over one flat array (see dslaunch/cpu_optim.h).
#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_lion
#endif

// lion(param, param_dtype, grad, grad_dtype, exp_avg, copy, copy_dtype, n,
//      lr, beta1, beta2, weight_decay, grad_scale, nthreads)
static PyObject* lion(PyObject*, PyObject* args) {
  unsigned long long p, g, m, c;
  int pdt, gdt, cdt, nthreads;
  long long n;
  double lr, beta1, beta2, wd, grad_scale;
  if (!PyArg_ParseTuple(args, "KiKiKKiLdddddi", &p, &pdt, &g, &gdt, &m, &c, &cdt, &n, &lr, &beta1,
                        &beta2, &wd, &grad_scale, &nthreads))
    return nullptr;
  const dslaunch::LionArgs a{lr, beta1, beta2, wd, grad_scale};
  bool ok;
  Py_BEGIN_ALLOW_THREADS
  ok = dslaunch::dispatch_dtypes(pdt, gdt, cdt, p, g, c, [&](auto* pp, auto* gp, auto* cp) {
    dslaunch::lion_kernel(pp, gp, reinterpret_cast<float*>(m), cp, n, a, nthreads);
  });
  Py_END_ALLOW_THREADS
  if (!ok) return dslaunch::bad_dtypes(pdt, gdt, cdt);
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "Lion CPU step (SIMD + OpenMP)",
                   {"lion", lion, METH_VARARGS, "one Lion step over a flat array"})
