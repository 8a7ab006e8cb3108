/*
 * The Python side of the SWIG interface: the module flashattn.flashattn_swig (the low layer under
 * the flashattn package). Generate with
 *   swig -python -threads -I<include dirs of flashattn.h and version.h> flashattn_swig.i
 * (setup.py does it). -threads releases the GIL around every call into the library.
 *
 * How the C API looks from here:
 *  - A failing status raises flashattn_swig.Error(status, message); on success a function returns
 *    None, or the values of its scalar/handle output parameters (`out`), which it no longer takes.
 *  - Structs (flashattn_tensor_t, flashattn_options_t) are SWIG proxies filled in place, as in C:
 *    t = flashattn_tensor_t(); flashattn_tensor_4d(t, address, dtype, b, n, h, d).
 *  - Addresses (void *) are Python ints; None is NULL. Host memory to copy from or to is any
 *    object with the buffer protocol (bytes, bytearray, a C-contiguous numpy array).
 *  - shape and strides read as tuples and are set from sequences of FLASHATTN_MAX_RANK ints.
 */
%module(package="flashattn") flashattn_swig

%{
#include <string.h>

#include <flashattn/flashattn.h>

/* The Error class defined below in the module's Python code, found on first use. */
static PyObject *flashattn_swig_error_class(void) {
  static PyObject *cls = NULL;
  if (cls == NULL) {
    PyObject *mod = PyImport_ImportModule("flashattn.flashattn_swig");
    if (mod != NULL) {
      cls = PyObject_GetAttrString(mod, "Error");
      Py_DECREF(mod);
    }
    if (cls == NULL) {
      PyErr_Clear();
      return PyExc_RuntimeError;
    }
  }
  return cls;
}

/* Raises Error(status, message) with this thread's last-error text. */
static void flashattn_swig_set_error(flashattn_status_t status) {
  const char *msg = flashattn_last_error();
  PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
  PyObject *args = text != NULL ? Py_BuildValue("(iN)", (int)status, text) : NULL;
  if (args != NULL) {
    PyErr_SetObject(flashattn_swig_error_class(), args);
    Py_DECREF(args);
  }
}

#define FLASHATTN_SWIG_RAISE(status) \
  do {                               \
    flashattn_swig_set_error(status); \
    SWIG_fail;                       \
  } while (0)

/* Adds an output parameter's value to a call's result. A call whose status became None returns
 * the value alone, and several values as a list. SWIG's own SWIG_Python_AppendOutput does so only
 * before SWIG 4.3; later ones return [None, value] for a function that is not void in C. */
static PyObject *flashattn_swig_append(PyObject *result, PyObject *value) {
  if (result == NULL || result == Py_None) {
    Py_XDECREF(result);
    return value;
  }
  if (!PyList_Check(result)) {
    PyObject *list = PyList_New(1);
    if (list == NULL) {
      Py_DECREF(value);
      return result;
    }
    PyList_SET_ITEM(list, 0, result);
    result = list;
  }
  PyList_Append(result, value);
  Py_DECREF(value);
  return result;
}

/* A proxy for an options struct the caller placed in memory of its own (not owned by the proxy). */
static flashattn_options_t *options_at(void *address) { return (flashattn_options_t *)address; }
%}

/* ---- statuses: success is None; failures were raised by %exception ---- */
%typemap(out) flashattn_status_t "$result = SWIG_Py_Void();"

/* ---- output parameters: returned, not passed ---- */
%define FLASHATTN_HANDLE_OUT(TYPE)
%typemap(in, numinputs=0) TYPE *out (TYPE temp = NULL) "$1 = &temp;"
%typemap(argout) TYPE *out
  "$result = flashattn_swig_append($result, SWIG_NewPointerObj(SWIG_as_voidptr(temp$argnum), $*1_descriptor, 0));"
%enddef
FLASHATTN_HANDLE_OUT(flashattn_context_t)
FLASHATTN_HANDLE_OUT(flashattn_buffer_t)

%define FLASHATTN_SCALAR_OUT(TYPE, TO_PYTHON)
%typemap(in, numinputs=0) TYPE *out (TYPE temp = 0) "$1 = &temp;"
%typemap(argout) TYPE *out "$result = flashattn_swig_append($result, TO_PYTHON(temp$argnum));"
%enddef
FLASHATTN_SCALAR_OUT(int, PyLong_FromLong)
FLASHATTN_SCALAR_OUT(size_t, PyLong_FromSize_t)
FLASHATTN_SCALAR_OUT(flashattn_backend_t, PyLong_FromLong)
FLASHATTN_SCALAR_OUT(flashattn_cpu_kernels_t, PyLong_FromLong)
FLASHATTN_SCALAR_OUT(void *, PyLong_FromVoidPtr)

/* ---- addresses: Python ints (None is NULL) ---- */
%typemap(in) void * {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (PyLong_Check($input)) {
    $1 = PyLong_AsVoidPtr($input);
    if ($1 == NULL && PyErr_Occurred()) SWIG_fail;
  } else {
    PyErr_Format(PyExc_TypeError, "$symname: an address (int) or None is expected, not %s",
                 Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
}
%typemap(out) void * "$result = PyLong_FromVoidPtr($1);"

/* ---- host memory for buffer copies: the buffer protocol, held (and the GIL released) during the
        call ---- */
%typemap(in) (const void *src, size_t bytes) (Py_buffer view, int have_view = 0) {
  if (PyObject_GetBuffer($input, &view, PyBUF_SIMPLE) != 0) SWIG_fail;
  have_view = 1;
  $1 = view.buf;
  $2 = (size_t)view.len;
}
%typemap(in) (void *dst, size_t bytes) (Py_buffer view, int have_view = 0) {
  if (PyObject_GetBuffer($input, &view, PyBUF_WRITABLE) != 0) SWIG_fail;
  have_view = 1;
  $1 = view.buf;
  $2 = (size_t)view.len;
}
%typemap(freearg) (const void *src, size_t bytes), (void *dst, size_t bytes) {
  if (have_view$argnum) PyBuffer_Release(&view$argnum);
}

/* flashattn_last_error_r(maxsize) returns [full_length, text]. */
%include <cstring.i>
%cstring_output_maxsize(char *buf, size_t len);

/* ---- shape / strides: tuples out, sequences of exactly FLASHATTN_MAX_RANK ints in ---- */
%typemap(out) int64_t [ANY] {
  Py_ssize_t i;
  $result = PyTuple_New($1_dim0);
  if ($result == NULL) SWIG_fail;
  for (i = 0; i < $1_dim0; ++i) PyTuple_SET_ITEM($result, i, PyLong_FromLongLong((long long)$1[i]));
}
%typemap(in) int64_t [ANY] (int64_t temp[$1_dim0]) {
  Py_ssize_t i;
  PyObject *seq = PySequence_Fast($input, "$symname: a sequence of ints is expected");
  if (seq == NULL) SWIG_fail;
  if (PySequence_Fast_GET_SIZE(seq) != $1_dim0) {
    PyErr_Format(PyExc_ValueError, "$symname: %d values are expected, not %zd", (int)$1_dim0,
                 PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    SWIG_fail;
  }
  for (i = 0; i < $1_dim0; ++i) {
    temp[i] = (int64_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (temp[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      SWIG_fail;
    }
  }
  Py_DECREF(seq);
  $1 = temp;
}
%typemap(memberin) int64_t [ANY] "memcpy($1, $input, sizeof(int64_t) * $1_dim0);"

%include "../flashattn.i"

%noexception options_at;
flashattn_options_t *options_at(void *address);

/* flashattn_cp_args_t's exchange (a C function pointer, which SWIG leaves out): set from an
 * address, e.g. of a ctypes callback that the caller keeps alive through the call. */
%noexception cp_args_set_exchange;
%inline %{
static void cp_args_set_exchange(flashattn_cp_args_t *cp, void *exchange, void *user) {
  cp->exchange = (flashattn_cp_exchange_fn)exchange;
  cp->exchange_user = user;
}
%}

/* The sizes of the structs as this module was compiled (those its proxies allocate). In C,
 * flashattn_options_init(&o), flashattn_args_init(&a) and flashattn_merge_args_init(&m) are
 * macros that pass sizeof(o) to the _sized functions; SWIG wraps no function-like macro, so the
 * module defines them below. */
%constant size_t SIZEOF_OPTIONS = sizeof(flashattn_options_t);
%constant size_t SIZEOF_ARGS = sizeof(flashattn_args_t);
%constant size_t SIZEOF_MERGE_ARGS = sizeof(flashattn_merge_args_t);
%constant size_t SIZEOF_CP_ARGS = sizeof(flashattn_cp_args_t);

%pythoncode %{
def flashattn_options_init(options):
    """Fills a flashattn_options_t proxy with the defaults, size included: C's
    flashattn_options_init(&o), that is flashattn_options_init_sized(o, SIZEOF_OPTIONS)."""
    flashattn_options_init_sized(options, SIZEOF_OPTIONS)


def flashattn_args_init(args):
    """Fills a flashattn_args_t proxy with the defaults, size included: C's
    flashattn_args_init(&a), that is flashattn_args_init_sized(a, SIZEOF_ARGS)."""
    flashattn_args_init_sized(args, SIZEOF_ARGS)


def flashattn_merge_args_init(args):
    """Fills a flashattn_merge_args_t proxy with the defaults, size included: C's
    flashattn_merge_args_init(&m), that is flashattn_merge_args_init_sized(m, SIZEOF_MERGE_ARGS)."""
    flashattn_merge_args_init_sized(args, SIZEOF_MERGE_ARGS)


def flashattn_cp_args_init(args):
    """Fills a flashattn_cp_args_t proxy with the defaults, size included: C's
    flashattn_cp_args_init(&cp), that is flashattn_cp_args_init_sized(cp, SIZEOF_CP_ARGS)."""
    flashattn_cp_args_init_sized(args, SIZEOF_CP_ARGS)


class Error(RuntimeError):
    """A failing flashattn status, with the library's message (flashattn_last_error())."""

    def __init__(self, status, message):
        super().__init__(status, message)
        self.status = int(status)
        self.message = message

    @property
    def status_name(self):
        """The status's name, e.g. "FLASHATTN_ERROR_INVALID_SHAPE"."""
        return flashattn_status_string(self.status)

    def __str__(self):
        return "%s: %s" % (self.status_name, self.message)
%}
