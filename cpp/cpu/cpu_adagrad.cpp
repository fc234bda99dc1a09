// Op "cpu_adagrad": Adagrad step over one flat array (see dslaunch/cpu_optim.h).
#include "dslaunch/py_optim.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME cpu_adagrad
#endif

// adagrad(param, param_dtype, grad, grad_dtype, state_sum, copy, copy_dtype, n,
//         lr, lr_decay, eps, weight_decay, step, grad_scale, nthreads)
static PyObject* adagrad(PyObject*, PyObject* args) {
  unsigned long long p, g, s, c;
  int pdt, gdt, cdt, nthreads;
  long long n, step;
  double lr, lr_decay, eps, wd, grad_scale;
  if (!PyArg_ParseTuple(args, "KiKiKKiLddddLdi", &p, &pdt, &g, &gdt, &s, &c, &cdt, &n, &lr,
                        &lr_decay, &eps, &wd, &step, &grad_scale, &nthreads))
    return nullptr;
  const dslaunch::AdagradArgs a{lr, lr_decay, eps, wd, step, grad_scale};
  bool ok;
  Py_BEGIN_ALLOW_THREADS
  ok = dslaunch::dispatch_dtypes(pdt, gdt, cdt, p, g, c, [&](auto* pp, auto* gp, auto* cp) {
    dslaunch::adagrad_kernel(pp, gp, reinterpret_cast<float*>(s), cp, n, a, nthreads);
  });
  Py_END_ALLOW_THREADS
  if (!ok) return dslaunch::bad_dtypes(pdt, gdt, cdt);
  Py_RETURN_NONE;
}

DSLAUNCH_PY_MODULE(TORCH_EXTENSION_NAME, "Adagrad CPU step (SIMD + OpenMP)",
                   {"adagrad", adagrad, METH_VARARGS, "one Adagrad step over a flat array"})
