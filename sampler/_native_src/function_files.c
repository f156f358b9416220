/* The web UI's function index in C, its second half: filing each stack under its functions,
 * given their numbers (function_numbers.c).
 *
 * webui/functable_numbering.py holds the same in Python, the fallback where this extension is
 * not built; its tests hold the two to the same numbers. Everything below runs under the GIL.
 */
#include "native.h"
#include "module.h"

/* Returns {number: bytes of the ordinals} of the numbers in ``counts`` (those with any). */
static PyObject *filed(const Py_ssize_t *counts, const Py_ssize_t *offsets, const int *ordinals,
                       Py_ssize_t functions)
{
    PyObject *out = PyDict_New();
    for (Py_ssize_t n = 0; out != NULL && n < functions; n++) {
        if (counts[n] == 0) {
            continue;
        }
        PyObject *key = PyLong_FromSsize_t(n);
        PyObject *value = PyBytes_FromStringAndSize((const char *)(ordinals + offsets[n]),
                                                    counts[n] * sizeof(int));
        if (key == NULL || value == NULL || PyDict_SetItem(out, key, value) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return out;
}

/* file_functions(stacks, first, functions) -> ({number: ordinals}, {number: ordinals}). */
PyObject *native_file_functions(PyObject *module, PyObject *args)
{
    PyObject *stacks;
    Py_ssize_t first, functions;
    if (!PyArg_ParseTuple(args, "O!nn:file_functions", &PyList_Type, &stacks, &first,
                          &functions)) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(stacks);
    if (first < 0 || functions < 0 || functions > (Py_ssize_t)INT_MAX + 1 ||
        (count > 0 && first > (Py_ssize_t)INT_MAX - (count - 1))) {
        PyErr_SetString(PyExc_ValueError, "ordinals and numbers must fit an int, and be positive");
        return NULL;
    }
    /* Counting sort: how many stacks each function holds and ends, then the ordinals in place. */
    Py_ssize_t *holds = PyMem_Calloc((size_t)functions * 4 + 2, sizeof(Py_ssize_t));
    Py_buffer *views = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    int *ordinals = NULL, *leaves = NULL;
    PyObject *result = NULL;
    Py_ssize_t viewed = 0, total = 0;
    if (holds == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *ends = holds + functions, *at = ends + functions, *leaf_at = at + functions;
    for (; viewed < count; viewed++) {
        Py_buffer *view = &views[viewed];
        if (PyObject_GetBuffer(PyList_GET_ITEM(stacks, viewed), view, PyBUF_FORMAT) < 0) {
            goto done;
        }
        if (view->itemsize != sizeof(int) || view->format == NULL || strcmp(view->format, "i")) {
            PyBuffer_Release(view);
            PyErr_SetString(PyExc_TypeError, "stacks must be arrays of type 'i'");
            goto done;
        }
        const int *numbers = view->buf;
        Py_ssize_t length = view->len / (Py_ssize_t)sizeof(int);
        for (Py_ssize_t k = 0; k < length; k++) {
            if (numbers[k] < 0 || numbers[k] >= functions) {
                PyBuffer_Release(view);
                PyErr_SetString(PyExc_ValueError, "a function number past the functions");
                goto done;
            }
            holds[numbers[k]]++;
        }
        if (length) {
            ends[numbers[0]]++;
        }
        total += length;
    }
    ordinals = PyMem_Malloc((size_t)total * sizeof(int) + 1);
    leaves = PyMem_Malloc((size_t)count * sizeof(int) + 1);
    if (ordinals == NULL || leaves == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t next = 0, next_leaf = 0;
    for (Py_ssize_t n = 0; n < functions; n++) {
        at[n] = next;
        leaf_at[n] = next_leaf;
        next += holds[n];
        next_leaf += ends[n];
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const int *numbers = views[i].buf;
        Py_ssize_t length = views[i].len / (Py_ssize_t)sizeof(int);
        int ordinal = (int)(first + i);
        for (Py_ssize_t k = 0; k < length; k++) {
            ordinals[at[numbers[k]]++] = ordinal;
        }
        if (length) {
            leaves[leaf_at[numbers[0]]++] = ordinal;
        }
    }
    /* at[] and leaf_at[] now hold each function's end: its start is end - count. */
    for (Py_ssize_t n = 0; n < functions; n++) {
        at[n] -= holds[n];
        leaf_at[n] -= ends[n];
    }
    PyObject *by_function = filed(holds, at, ordinals, functions);
    PyObject *by_leaf = by_function != NULL ? filed(ends, leaf_at, leaves, functions) : NULL;
    if (by_leaf != NULL) {
        result = PyTuple_Pack(2, by_function, by_leaf);
    }
    Py_XDECREF(by_function);
    Py_XDECREF(by_leaf);
done:
    for (Py_ssize_t i = 0; i < viewed; i++) {
        PyBuffer_Release(&views[i]);
    }
    PyMem_Free(views);
    PyMem_Free(holds);
    PyMem_Free(ordinals);
    PyMem_Free(leaves);
    return result;
}
