/* The web UI's stack index in C: folded stacks, one per line, turned into sort keys and put in
 * order. A fresh server's first window of 200,000 stacks is ~100 MB of text: in Python, the
 * separators' replace, the split and the sort of the keys with their ids take ~0.4 s.
 *
 * A sort key is its stack with each ';' replaced by \x01 (sampler.profile's sort_key): the
 * replacement is made in a copy of the text, whose lines are sorted and made into str.
 * webui/model/linesort.py holds the same in Python, the fallback where this extension is not
 * built or the text is not one byte a character; its tests hold the two to the same keys and
 * ids. The copy and the sort run without the GIL (the text is immutable, and held), so other
 * threads go on meanwhile. Below them, two more of the index's passes over every stack of a
 * window: merge_sorted (new keys into known ones) and spread_counts (a window's counts laid over
 * the index's keys), under the GIL.
 */
#include "native.h"
#include "module.h"

#include <string.h>

#define SEPARATOR ';'
#define SORT_SEPARATOR 1
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* A line of the text: a key, once its separators are replaced. */
typedef struct {
    const unsigned char *start;
    Py_ssize_t length;
    Py_ssize_t line; /* its position in the text, which orders equal keys and picks its id */
} key_span;

/* The byte at 0x80 in each byte of ``word`` that equals ``byte``, 0 elsewhere. */
static inline uint64_t bytes_equal(uint64_t word, unsigned char byte)
{
    uint64_t x = word ^ (ONES * byte);
    return ~(((x & ~HIGHS) + ~HIGHS) | x | ~HIGHS);
}

static inline unsigned char sort_byte(unsigned char c)
{
    return c == SEPARATOR ? SORT_SEPARATOR : c;
}

/* Orders two keys as Python orders str (code points, a prefix first), equal ones by their
 * lines. */
static int compare_keys(const void *a, const void *b)
{
    const key_span *x = *(const key_span *const *)a, *y = *(const key_span *const *)b;
    Py_ssize_t shorter = x->length < y->length ? x->length : y->length;
    int order = memcmp(x->start, y->start, (size_t)shorter);
    if (order != 0) {
        return order;
    }
    if (x->length != y->length) {
        return x->length < y->length ? -1 : 1;
    }
    return x->line < y->line ? -1 : (x->line > y->line);
}

/* Copies the text with its separators replaced, eight bytes at a time. */
static void copy_keys(unsigned char *out, const unsigned char *in, Py_ssize_t length)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= length; i += 8) {
        uint64_t word;
        memcpy(&word, in + i, 8);
        /* Where a byte is the separator, (its 0x80 >> 7) * (';' ^ 1) turns it into 1. */
        word ^= (bytes_equal(word, SEPARATOR) >> 7) * (SEPARATOR ^ SORT_SEPARATOR);
        memcpy(out + i, &word, 8);
    }
    for (; i < length; i++) {
        out[i] = sort_byte(in[i]);
    }
}

/* Records each line of the text in ``spans``; returns the number of lines, or -1 past
 * ``count``. */
static Py_ssize_t split_lines(const unsigned char *text, Py_ssize_t size, key_span *spans,
                              Py_ssize_t count)
{
    Py_ssize_t lines = 0;
    const unsigned char *at = text, *end = text + size;
    for (;;) {
        const unsigned char *newline = memchr(at, '\n', (size_t)(end - at));
        if (lines == count) {
            return -1;
        }
        const unsigned char *stop = newline != NULL ? newline : end;
        spans[lines] = (key_span){at, stop - at, lines};
        lines++;
        if (newline == NULL) {
            return lines;
        }
        at = newline + 1;
    }
}

/* Copies, splits and sorts, without the GIL: returns the number of lines (``order`` then
 * points to the spans, in ``copy``, in order), or -1 when the text must take the Python path:
 * it holds \x01 or \x02, which sort keys escape, or more lines than ``count``. */
static Py_ssize_t sort_spans(const unsigned char *text, Py_ssize_t size, unsigned char *copy,
                             key_span *spans, const key_span **order, Py_ssize_t count)
{
    if (memchr(text, 1, (size_t)size) != NULL || memchr(text, 2, (size_t)size) != NULL) {
        return -1;
    }
    copy_keys(copy, text, size);
    Py_ssize_t lines = split_lines(copy, size, spans, count);
    if (lines != count) {
        return lines;
    }
    /* Pointers sorted, not the spans: the merge sort moves a third of the bytes. */
    for (Py_ssize_t i = 0; i < count; i++) {
        order[i] = &spans[i];
    }
    qsort(order, (size_t)count, sizeof(*order), compare_keys);
    return count;
}

/* The key of a span as a str; NULL with an exception set. */
static PyObject *key_string(const key_span *span, Py_UCS4 widest)
{
    if (widest >= 128) {
        /* Finds the key's widest character, so a key of ASCII only is made as such. */
        return PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, span->start, span->length);
    }
    PyObject *key = PyUnicode_New(span->length, 127);
    if (key != NULL) {
        memcpy(PyUnicode_1BYTE_DATA(key), span->start, (size_t)span->length);
    }
    return key;
}

/* (keys, ids in their order), from the sorted spans. The keys are made in the text's order,
 * reading it from start to end (in the sort's order, each would be a jump through ~100 MB). */
static PyObject *sorted_result(const key_span *spans, const key_span *const *order,
                               Py_ssize_t count, PyObject *ids, Py_UCS4 widest)
{
    PyObject *keys = PyList_New(count), *ordered = PyList_New(count);
    PyObject **made = PyMem_Calloc((size_t)count, sizeof(PyObject *));
    PyObject *result = NULL;
    if (keys == NULL || ordered == NULL || made == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((made[i] = key_string(&spans[i], widest)) == NULL) {
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t line = order[k]->line;
        PyList_SET_ITEM(keys, k, made[line]); /* the list takes the reference */
        made[line] = NULL;
        PyObject *sid = PyList_GET_ITEM(ids, line);
        PyList_SET_ITEM(ordered, k, Py_NewRef(sid));
    }
    result = PyTuple_Pack(2, keys, ordered);
done:
    if (made != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_XDECREF(made[i]);
        }
        PyMem_Free(made);
    }
    Py_XDECREF(keys);
    Py_XDECREF(ordered);
    if (result == NULL && !PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    return result;
}

/* The sort of a text of one byte a character, expected to hold as many lines as ``ids``. */
static PyObject *sort_text(PyObject *lines, PyObject *ids)
{
    Py_ssize_t size = PyUnicode_GET_LENGTH(lines), count = PyList_GET_SIZE(ids);
    unsigned char *copy = PyMem_RawMalloc((size_t)size + 1);
    key_span *spans = PyMem_RawMalloc((size_t)count * sizeof(key_span));
    const key_span **order = PyMem_RawMalloc((size_t)count * sizeof(key_span *));
    PyObject *result = NULL;
    if (copy == NULL || spans == NULL || order == NULL) {
        PyErr_NoMemory();
    } else {
        const unsigned char *text = PyUnicode_1BYTE_DATA(lines);
        Py_ssize_t found;
        Py_BEGIN_ALLOW_THREADS
        found = sort_spans(text, size, copy, spans, order, count);
        Py_END_ALLOW_THREADS
        if (found == count) {
            result = sorted_result(spans, order, count, ids, PyUnicode_MAX_CHAR_VALUE(lines));
        } else if (found >= 0) {
            PyErr_Format(PyExc_ValueError, "expected %zd stacks, got %zd lines", count, found);
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    PyMem_RawFree(copy);
    PyMem_RawFree(spans);
    PyMem_RawFree(order);
    return result;
}

/* sort_lines(lines, ids) -> (keys, ids) or None. */
PyObject *native_sort_lines(PyObject *module, PyObject *args)
{
    PyObject *lines, *ids;
    if (!PyArg_ParseTuple(args, "UO!:sort_lines", &lines, &PyList_Type, &ids)) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(lines) < 0) { /* a legacy string of the deprecated C API */
        return NULL;
    }
#endif
    /* A copy of the ids: the caller's list could change while the text is sorted. */
    ids = PyList_GetSlice(ids, 0, PyList_GET_SIZE(ids));
    if (ids == NULL) {
        return NULL;
    }
    PyObject *result;
    if (PyList_GET_SIZE(ids) == 0) {
        result = Py_BuildValue("([]O)", ids);
    } else if (PyUnicode_KIND(lines) != PyUnicode_1BYTE_KIND) {
        result = Py_NewRef(Py_None); /* characters past Latin-1: the Python path */
    } else {
        result = sort_text(lines, ids);
    }
    Py_DECREF(ids);
    return result;
}

/* Orders two str as Python does: code points, a prefix first. -2 with an exception set. */
static int compare_str(PyObject *a, PyObject *b)
{
    if (!PyUnicode_Check(a) || !PyUnicode_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "keys must be str");
        return -2;
    }
    if (PyUnicode_KIND(a) == PyUnicode_1BYTE_KIND && PyUnicode_KIND(b) == PyUnicode_1BYTE_KIND) {
        Py_ssize_t m = PyUnicode_GET_LENGTH(a), n = PyUnicode_GET_LENGTH(b);
        int order = memcmp(PyUnicode_1BYTE_DATA(a), PyUnicode_1BYTE_DATA(b), (size_t)(m < n ? m : n));
        return order != 0 ? (order > 0) - (order < 0) : (m > n) - (m < n);
    }
    return PyUnicode_Compare(a, b); /* -1, 0 or 1: kinds differ, so no error */
}

/* merge_sorted(keys, ids, new_keys, new_ids) -> (keys, ids). */
PyObject *native_merge_sorted(PyObject *module, PyObject *args)
{
    PyObject *keys, *ids, *new_keys, *new_ids;
    if (!PyArg_ParseTuple(args, "O!O!O!O!:merge_sorted", &PyList_Type, &keys, &PyList_Type, &ids,
                          &PyList_Type, &new_keys, &PyList_Type, &new_ids)) {
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(keys), n = PyList_GET_SIZE(new_keys);
    if (PyList_GET_SIZE(ids) != m || PyList_GET_SIZE(new_ids) != n) {
        PyErr_SetString(PyExc_ValueError, "as many ids as keys are needed");
        return NULL;
    }
    PyObject *out_keys = PyList_New(m + n), *out_ids = PyList_New(m + n);
    if (out_keys == NULL || out_ids == NULL) {
        goto failed;
    }
    /* Item by item, under the GIL (comparing reads no Python code: the lists cannot change). */
    Py_ssize_t i = 0, j = 0;
    for (Py_ssize_t k = 0; k < m + n; k++) {
        int from_new = i == m;
        if (i < m && j < n) {
            int order = compare_str(PyList_GET_ITEM(keys, i), PyList_GET_ITEM(new_keys, j));
            if (order == -2) {
                goto failed;
            }
            from_new = order > 0; /* equal keys: the known first, as a stable sort puts them */
        }
        PyObject *key = from_new ? PyList_GET_ITEM(new_keys, j) : PyList_GET_ITEM(keys, i);
        PyObject *sid = from_new ? PyList_GET_ITEM(new_ids, j) : PyList_GET_ITEM(ids, i);
        *(from_new ? &j : &i) += 1;
        PyList_SET_ITEM(out_keys, k, Py_NewRef(key));
        PyList_SET_ITEM(out_ids, k, Py_NewRef(sid));
    }
    PyObject *result = PyTuple_Pack(2, out_keys, out_ids);
    Py_DECREF(out_keys);
    Py_DECREF(out_ids);
    return result;
failed:
    Py_XDECREF(out_keys);
    Py_XDECREF(out_ids);
    return NULL;
}

/* spread_counts(rank, counts, size) -> list or None. */
PyObject *native_spread_counts(PyObject *module, PyObject *args)
{
    PyObject *rank, *counts;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "O!O!n:spread_counts", &PyDict_Type, &rank, &PyDict_Type, &counts,
                          &size)) {
        return NULL;
    }
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "size must not be negative");
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    PyObject *dense = zero != NULL ? PyList_New(size) : NULL;
    if (dense == NULL) {
        Py_XDECREF(zero);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyList_SET_ITEM(dense, i, Py_NewRef(zero));
    }
    Py_DECREF(zero);
    Py_ssize_t pos = 0;
    PyObject *sid, *count;
    while (PyDict_Next(counts, &pos, &sid, &count)) {
        PyObject *at = PyDict_GetItemWithError(rank, sid); /* borrowed */
        if (at == NULL) {
            Py_DECREF(dense);
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE; /* a stack the index does not know: the caller learns it first */
        }
        Py_ssize_t k = PyLong_AsSsize_t(at);
        if (k < 0 || k >= size) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "a rank of %zd in %zd keys", k, size);
            }
            Py_DECREF(dense);
            return NULL;
        }
        PyObject *old = PyList_GET_ITEM(dense, k);
        PyList_SET_ITEM(dense, k, Py_NewRef(count));
        Py_DECREF(old);
    }
    return dense;
}
