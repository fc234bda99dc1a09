// CPython glue for the CUDA op bindings (no pybind11, no torch headers). Python passes raw device
// pointers and the CUDA stream handle (torch.cuda.current_stream().cuda_stream) as integers; the
// Python wrapper (dslaunch/kernels/cuda_ops.py) has checked devices, dtypes and sizes.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dslaunch_cuda.cuh"

inline PyObject* dslaunch_cuda_result(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", what, cudaGetErrorString(err));
    return nullptr;
  }
  Py_RETURN_NONE;
}

#define DSLAUNCH_CUDA_STR_(x) #x
#define DSLAUNCH_CUDA_STR(x) DSLAUNCH_CUDA_STR_(x)
#define DSLAUNCH_CUDA_MODULE(NAME, DOC, ...) DSLAUNCH_CUDA_MODULE_(NAME, DOC, __VA_ARGS__)
#define DSLAUNCH_CUDA_MODULE_(NAME, DOC, ...)                                                 \
  static PyMethodDef dslaunch_methods[] = {__VA_ARGS__, {nullptr, nullptr, 0, nullptr}};      \
  static struct PyModuleDef dslaunch_module = {PyModuleDef_HEAD_INIT, DSLAUNCH_CUDA_STR(NAME),  \
                                               DOC, -1, dslaunch_methods};                   \
  PyMODINIT_FUNC PyInit_##NAME(void) { return PyModule_Create(&dslaunch_module); }
