// Minimal CPython glue shared by the CPU optimizer ops (no pybind11, no torch headers: an op
// compiles in about a second). Python passes raw data pointers plus dtype codes; the Python
// wrapper (dslaunch/kernels/cpu_optim.py) has already checked devices, dtypes, sizes, contiguity.
// dtype codes: 0 = float32, 1 = bfloat16, -1 = no such array (the optional copy).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dslaunch/cpu_optim.h"

namespace dslaunch {

// Calls f(param*, grad*, copy*) with the pointer types the dtype codes name; false if unsupported.
template <class F>
bool dispatch_dtypes(int pdt, int gdt, int cdt, uintptr_t p, uintptr_t g, uintptr_t c, F&& f) {
  auto with_copy = [&](auto* pp, auto* gp) -> bool {
    switch (cdt) {
      case -1: f(pp, gp, static_cast<NoCopy*>(nullptr)); return true;
      case 0: f(pp, gp, reinterpret_cast<float*>(c)); return true;
      case 1: f(pp, gp, reinterpret_cast<bf16_t*>(c)); return true;
    }
    return false;
  };
  auto with_grad = [&](auto* pp) -> bool {
    switch (gdt) {
      case 0: return with_copy(pp, reinterpret_cast<const float*>(g));
      case 1: return with_copy(pp, reinterpret_cast<const bf16_t*>(g));
    }
    return false;
  };
  switch (pdt) {
    case 0: return with_grad(reinterpret_cast<float*>(p));
    case 1: return with_grad(reinterpret_cast<bf16_t*>(p));
  }
  return false;
}

inline PyObject* bad_dtypes(int pdt, int gdt, int cdt) {
  PyErr_Format(PyExc_TypeError, "unsupported dtype codes param=%d grad=%d copy=%d", pdt, gdt, cdt);
  return nullptr;
}

inline PyObject* simd_level(PyObject*, PyObject*) { return PyUnicode_FromString(DSLAUNCH_SIMD_NAME); }

}  // namespace dslaunch

// Declares the module PyInit_<NAME> with the given method table plus simd_level(). The builder
// passes -DTORCH_EXTENSION_NAME=<module name> (torch may suffix it, e.g. cpu_adam_v1), and the
// init function must carry that exact name, hence the two-level expansion.
#define DSLAUNCH_PY_MODULE(NAME, DOC, ...) DSLAUNCH_PY_MODULE_(NAME, DOC, __VA_ARGS__)
#define DSLAUNCH_STR_(x) #x
#define DSLAUNCH_STR(x) DSLAUNCH_STR_(x)
#define DSLAUNCH_PY_MODULE_(NAME, DOC, ...)                                                   \
  static PyMethodDef dslaunch_methods[] = {                                                  \
      __VA_ARGS__,                                                                           \
      {"simd_level", dslaunch::simd_level, METH_NOARGS, "SIMD level of this build"},         \
      {nullptr, nullptr, 0, nullptr}};                                                       \
  static struct PyModuleDef dslaunch_module = {PyModuleDef_HEAD_INIT, DSLAUNCH_STR(NAME), DOC, -1, \
                                               dslaunch_methods};                            \
  PyMODINIT_FUNC PyInit_##NAME(void) { return PyModule_Create(&dslaunch_module); }
