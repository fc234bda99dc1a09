// CPython binding of the async I/O engine (no pybind11, no torch headers). Python passes raw data
// pointers and byte counts; dslaunch/nvme/aio.py has already checked the tensors and keeps them
// alive until the op is waited for.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdexcept>
#include <string>

#include "aio_engine.h"

namespace {

const char* kCapsule = "dslaunch.aio.Handle";

dsaio::Handle* get(PyObject* cap) {
  return static_cast<dsaio::Handle*>(PyCapsule_GetPointer(cap, kCapsule));
}

void destroy(PyObject* cap) {
  auto* h = get(cap);
  if (!h) return;
  Py_BEGIN_ALLOW_THREADS delete h;
  Py_END_ALLOW_THREADS
}

PyObject* new_handle(PyObject*, PyObject* args) {
  dsaio::Config c;
  long long block = 0;
  int single = 0, overlap = 1, direct = 1;
  const char* backend = "auto";
  if (!PyArg_ParseTuple(args, "Lippips", &block, &c.queue_depth, &single, &overlap, &c.threads,
                        &direct, &backend))
    return nullptr;
  c.block_size = block;
  c.single_submit = single;
  c.overlap_events = overlap;
  c.use_direct = direct;
  c.backend = backend;
  try {
    auto* h = new dsaio::Handle(c);
    return PyCapsule_New(h, kCapsule, destroy);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_OSError, e.what());
  }
  return nullptr;
}

PyObject* backend(PyObject*, PyObject* args) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "O", &cap)) return nullptr;
  auto* h = get(cap);
  if (!h) return nullptr;
  return Py_BuildValue("(ss)", h->backend().c_str(), h->backend_note().c_str());
}

PyObject* submit(PyObject*, PyObject* args) {
  PyObject *cap, *path_bytes = nullptr;
  int is_read = 0;
  unsigned long long ptr = 0;
  long long nbytes = 0, offset = 0;
  if (!PyArg_ParseTuple(args, "OpKLO&L", &cap, &is_read, &ptr, &nbytes, PyUnicode_FSConverter,
                        &path_bytes, &offset))
    return nullptr;
  auto* h = get(cap);
  std::string path(PyBytes_AS_STRING(path_bytes), PyBytes_GET_SIZE(path_bytes));
  Py_DECREF(path_bytes);
  if (!h) return nullptr;
  long long id = 0;
  std::string err;
  Py_BEGIN_ALLOW_THREADS try {
    id = h->submit(is_read, reinterpret_cast<char*>(ptr), nbytes, path, offset);
  } catch (const std::exception& e) {
    err = e.what();
  }
  Py_END_ALLOW_THREADS if (!err.empty()) {
    PyErr_SetString(PyExc_OSError, err.c_str());
    return nullptr;
  }
  return PyLong_FromLongLong(id);
}

PyObject* wait_op(PyObject*, PyObject* args) {
  PyObject* cap;
  long long id;
  if (!PyArg_ParseTuple(args, "OL", &cap, &id)) return nullptr;
  auto* h = get(cap);
  if (!h) return nullptr;
  std::string err;
  Py_BEGIN_ALLOW_THREADS err = h->wait_op(id);
  Py_END_ALLOW_THREADS if (!err.empty()) {
    PyErr_SetString(PyExc_OSError, err.c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* wait_all(PyObject*, PyObject* args) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "O", &cap)) return nullptr;
  auto* h = get(cap);
  if (!h) return nullptr;
  std::string err;
  long long n = 0;
  Py_BEGIN_ALLOW_THREADS n = h->wait_all(&err);
  Py_END_ALLOW_THREADS if (!err.empty()) {
    PyErr_SetString(PyExc_OSError, err.c_str());
    return nullptr;
  }
  return PyLong_FromLongLong(n);
}

PyObject* pending(PyObject*, PyObject* args) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "O", &cap)) return nullptr;
  auto* h = get(cap);
  if (!h) return nullptr;
  return PyLong_FromLongLong(h->pending());
}

PyObject* stats(PyObject*, PyObject* args) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "O", &cap)) return nullptr;
  auto* h = get(cap);
  if (!h) return nullptr;
  return Py_BuildValue("{sLsLsLsLsL}", "direct_bytes", (long long)h->stats.direct_bytes.load(),
                       "buffered_bytes", (long long)h->stats.buffered_bytes.load(), "bounce_bytes",
                       (long long)h->stats.bounce_bytes.load(), "ops", (long long)h->stats.ops.load(),
                       "requests", (long long)h->stats.requests.load());
}

PyObject* probe_direct(PyObject*, PyObject* args) {
  PyObject* dir_bytes = nullptr;
  if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &dir_bytes)) return nullptr;
  std::string dir(PyBytes_AS_STRING(dir_bytes), PyBytes_GET_SIZE(dir_bytes));
  Py_DECREF(dir_bytes);
  std::string why;
  bool ok;
  Py_BEGIN_ALLOW_THREADS ok = dsaio::Handle::probe_direct(dir, &why);
  Py_END_ALLOW_THREADS return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why.c_str());
}

PyObject* kernel_aio_compiled(PyObject*, PyObject*) {
  dsaio::Config c;
  c.backend = "linux-aio";
  c.queue_depth = 1;
  try {
    dsaio::Handle h(c);
    Py_RETURN_TRUE;
  } catch (const std::exception& e) {
    // Not compiled in, or io_setup failed right now: say which.
    return PyUnicode_FromString(e.what());
  }
}

PyMethodDef methods[] = {
    {"new_handle", new_handle, METH_VARARGS,
     "new_handle(block_size, queue_depth, single_submit, overlap_events, threads, use_direct, backend)"},
    {"backend", backend, METH_VARARGS, "backend(h) -> (name, note)"},
    {"submit", submit, METH_VARARGS, "submit(h, is_read, ptr, nbytes, path, offset) -> op id"},
    {"wait_op", wait_op, METH_VARARGS, "wait_op(h, id): block until op id is done; OSError on failure"},
    {"wait_all", wait_all, METH_VARARGS, "wait_all(h) -> ops completed; OSError on the first failure"},
    {"pending", pending, METH_VARARGS, "pending(h) -> ops not yet waited for"},
    {"stats", stats, METH_VARARGS, "stats(h) -> dict of byte/op counters"},
    {"probe_direct", probe_direct, METH_VARARGS, "probe_direct(dir) -> (bool, why)"},
    {"kernel_aio", kernel_aio_compiled, METH_NOARGS, "True, or why kernel AIO cannot be used"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// The builder passes -DTORCH_EXTENSION_NAME=<module name>; the init function must carry it.
#define DSAIO_STR_(x) #x
#define DSAIO_STR(x) DSAIO_STR_(x)
#define DSAIO_INIT_(name) PyInit_##name
#define DSAIO_INIT(name) DSAIO_INIT_(name)

static struct PyModuleDef aio_module = {PyModuleDef_HEAD_INIT, DSAIO_STR(TORCH_EXTENSION_NAME),
                                        "dslaunch async file I/O engine", -1, methods};

PyMODINIT_FUNC DSAIO_INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&aio_module); }
