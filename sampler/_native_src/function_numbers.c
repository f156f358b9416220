/* The web UI's function index in C, its first half: numbering the frames of folded stacks
 * (function_files.c files each stack under its functions). A window of 200,000 stacks of 35
 * frames is seven million frames, ~4 s of Python loops on a fresh server's first function table
 * or a warm-up.
 *
 * webui/functable_numbering.py holds the same in Python, the fallback where this extension is
 * not built; its tests hold the two to the same numbers. The web UI calls these in chunks of
 * stacks, so a call holds the interpreter for milliseconds. Everything below runs under the GIL.
 */
#include "native.h"
#include "module.h"

/* Numbers seen in the stack at hand: seen[number] == the stack's stamp. Grown with the names. */
typedef struct {
    uint32_t *seen;
    Py_ssize_t size;
} stamps;

static int stamps_fit(stamps *s, Py_ssize_t count)
{
    if (count <= s->size) {
        return 0;
    }
    Py_ssize_t size = s->size ? s->size : 1024;
    while (size < count) {
        size *= 2;
    }
    uint32_t *seen = PyMem_Realloc(s->seen, (size_t)size * sizeof(uint32_t));
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(seen + s->size, 0, (size_t)(size - s->size) * sizeof(uint32_t));
    s->seen = seen;
    s->size = size;
    return 0;
}

/* Names seen in this call, by the hash of their characters: a frame found here needs no str of
 * its own (making one for each of seven million frames was most of the time). */
typedef struct {
    uint64_t hash;
    Py_ssize_t number; /* -1: an empty slot */
} seen_name;

typedef struct {
    seen_name *slots;
    Py_ssize_t mask, used;
} name_table;

/* Probes past this many slots give up on the table for that frame (its name is looked up in
 * the dict instead, whose hash is seeded SipHash): names made to collide cost no more than
 * the dict. */
#define MAX_PROBES 64

static uint64_t hash_seed;

/* FNV-1a over the code points from a seed chosen once per process, then mixed (murmur3's
 * finaliser) so that every bit counts in the table's low bits. */
static uint64_t chars_hash(int kind, const void *data, Py_ssize_t start, Py_ssize_t end)
{
    uint64_t hash = 14695981039346656037ull ^ hash_seed;
    for (Py_ssize_t i = start; i < end; i++) {
        hash = (hash ^ PyUnicode_READ(kind, data, i)) * 1099511628211ull;
    }
    hash ^= hash >> 33;
    hash *= 0xff51afd7ed558ccdull;
    hash ^= hash >> 33;
    hash *= 0xc4ceb9fe1a85ec53ull;
    hash ^= hash >> 33;
    return hash;
}

static int seed_hash(void)
{
    if (hash_seed != 0) {
        return 0;
    }
    PyObject *os = PyImport_ImportModule("os");
    PyObject *bytes = os != NULL ? PyObject_CallMethod(os, "urandom", "i", 8) : NULL;
    Py_XDECREF(os);
    if (bytes == NULL) {
        return -1;
    }
    if (PyBytes_Check(bytes) && PyBytes_GET_SIZE(bytes) == 8) {
        memcpy(&hash_seed, PyBytes_AS_STRING(bytes), 8);
    }
    hash_seed |= 1; /* never 0 again: chosen once */
    Py_DECREF(bytes);
    return 0;
}

/* Whether ``name`` is the characters data[start:end] of a text of ``kind``. */
static int same_chars(PyObject *name, int kind, const void *data, Py_ssize_t start, Py_ssize_t end)
{
    if (!PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) != end - start) {
        return 0;
    }
    int name_kind = PyUnicode_KIND(name);
    const void *name_data = PyUnicode_DATA(name);
    if (name_kind == kind) {
        return memcmp(name_data, (const char *)data + start * kind, (size_t)(end - start) * kind) == 0;
    }
    for (Py_ssize_t i = start; i < end; i++) {
        if (PyUnicode_READ(name_kind, name_data, i - start) != PyUnicode_READ(kind, data, i)) {
            return 0;
        }
    }
    return 1;
}

/* The slot of the name with ``hash`` and these characters, or the empty slot it would take;
 * NULL past MAX_PROBES slots. */
static seen_name *table_find(name_table *t, PyObject *names, uint64_t hash, int kind,
                             const void *data, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t i = (Py_ssize_t)(hash & (uint64_t)t->mask);
    for (int probes = 0; probes < MAX_PROBES; probes++, i = (i + 1) & t->mask) {
        seen_name *slot = &t->slots[i];
        if (slot->number < 0 ||
            (slot->hash == hash && slot->number < PyList_GET_SIZE(names) &&
             same_chars(PyList_GET_ITEM(names, slot->number), kind, data, start, end))) {
            return slot;
        }
    }
    return NULL;
}

/* Makes room for one more name: at most half the slots used. */
static int table_room(name_table *t)
{
    if (t->slots != NULL && (t->used + 1) * 2 <= t->mask + 1) {
        return 0;
    }
    Py_ssize_t size = t->slots != NULL ? (t->mask + 1) * 2 : 4096;
    seen_name *slots = PyMem_Malloc((size_t)size * sizeof(seen_name));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        slots[i].number = -1;
    }
    seen_name *old = t->slots;
    Py_ssize_t old_size = old != NULL ? t->mask + 1 : 0;
    t->slots = slots;
    t->mask = size - 1;
    for (Py_ssize_t i = 0; i < old_size; i++) {
        if (old[i].number >= 0) {
            Py_ssize_t at = (Py_ssize_t)(old[i].hash & (uint64_t)t->mask);
            while (slots[at].number >= 0) {
                at = (at + 1) & t->mask;
            }
            slots[at] = old[i];
        }
    }
    PyMem_Free(old);
    return 0;
}

/* The number of the frame text[start:end], numbering it next if ``numbers`` lacks it. */
static Py_ssize_t frame_number(PyObject *text, Py_ssize_t start, Py_ssize_t end, PyObject *numbers,
                               PyObject *names)
{
    PyObject *name = PyUnicode_Substring(text, start, end);
    if (name == NULL) {
        return -1;
    }
    Py_ssize_t number = -1;
    PyObject *found = PyDict_GetItemWithError(numbers, name);
    if (found != NULL) {
        number = PyLong_AsSsize_t(found);
    } else if (!PyErr_Occurred()) {
        /* The dict first: a name in ``names`` only would be numbered twice by the next call. */
        number = PyList_GET_SIZE(names);
        PyObject *value = PyLong_FromSsize_t(number);
        if (value == NULL || PyDict_SetItem(numbers, name, value) < 0) {
            number = -1;
        } else if (PyList_Append(names, name) < 0) {
            PyObject *type, *error, *traceback;
            PyErr_Fetch(&type, &error, &traceback);
            if (PyDict_DelItem(numbers, name) < 0) {
                PyErr_Clear();
            }
            PyErr_Restore(type, error, traceback);
            number = -1;
        }
        Py_XDECREF(value);
    }
    Py_DECREF(name);
    if (number < 0 && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "function numbers must be positive ints");
    }
    return number;
}

/* number_functions(texts, separator, numbers, names) -> list of bytes: see module.c. */
PyObject *native_number_functions(PyObject *module, PyObject *args)
{
    PyObject *texts, *separator, *numbers, *names;
    if (!PyArg_ParseTuple(args, "O!UO!O!:number_functions", &PyList_Type, &texts, &separator,
                          &PyDict_Type, &numbers, &PyList_Type, &names)) {
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(separator) != 1) {
        PyErr_SetString(PyExc_ValueError, "the separator must be one character");
        return NULL;
    }
    Py_UCS4 sep = PyUnicode_READ_CHAR(separator, 0);
    /* A copy: a name's __eq__ (a str subclass as a key) could change the caller's list. */
    PyObject *items = PyList_GetSlice(texts, 0, PyList_GET_SIZE(texts));
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(count);
    stamps s = {NULL, 0};
    name_table table = {NULL, 0, 0};
    int *row = NULL;
    Py_ssize_t row_size = 0;
    if (out == NULL || seed_hash() < 0 || table_room(&table) < 0) {
        Py_DECREF(items);
        Py_XDECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *text = PyList_GET_ITEM(items, i);
        if (!PyUnicode_Check(text)) {
            PyErr_Format(PyExc_TypeError, "stack %zd is not a str", i);
            goto failed;
        }
        if (PyUnicode_READY(text) < 0) {
            goto failed;
        }
        Py_ssize_t length = PyUnicode_GET_LENGTH(text);
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        uint32_t stamp = (uint32_t)(i % 0xfffffffe) + 1;
        if (i > 0 && stamp == 1 && s.size) { /* the stamps wrapped: forget every mark */
            memset(s.seen, 0, (size_t)s.size * sizeof(uint32_t));
        }
        /* Leaf first: from the end of the text back to its start. */
        Py_ssize_t distinct = 0, end = length;
        for (;;) {
            Py_ssize_t at = end > 0 ? PyUnicode_FindChar(text, sep, 0, end, -1) : -1;
            if (at == -2) {
                goto failed;
            }
            uint64_t hash = chars_hash(kind, data, at + 1, end);
            seen_name *slot = table_find(&table, names, hash, kind, data, at + 1, end);
            Py_ssize_t number = slot != NULL ? slot->number : -1;
            if (number < 0) {
                number = frame_number(text, at + 1, end, numbers, names);
                if (number >= 0 && number < PyList_GET_SIZE(names) && slot != NULL) {
                    if (table_room(&table) < 0) {
                        goto failed;
                    }
                    slot = table_find(&table, names, hash, kind, data, at + 1, end);
                    if (slot != NULL) {
                        slot->hash = hash;
                        slot->number = number;
                        table.used++;
                    }
                }
            }
            if (number < 0 || number > INT_MAX || stamps_fit(&s, number + 1) < 0) {
                if (number > INT_MAX) {
                    PyErr_SetString(PyExc_OverflowError, "too many functions");
                }
                goto failed;
            }
            if (s.seen[number] != stamp) {
                if (distinct == row_size) {
                    Py_ssize_t size = row_size ? row_size * 2 : 64;
                    int *grown = PyMem_Realloc(row, (size_t)size * sizeof(int));
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto failed;
                    }
                    row = grown;
                    row_size = size;
                }
                s.seen[number] = stamp;
                row[distinct++] = (int)number;
            }
            if (at < 0) {
                break;
            }
            end = at;
        }
        PyObject *packed = PyBytes_FromStringAndSize((const char *)row, distinct * sizeof(int));
        if (packed == NULL) {
            goto failed;
        }
        PyList_SET_ITEM(out, i, packed);
    }
    PyMem_Free(s.seen);
    PyMem_Free(table.slots);
    PyMem_Free(row);
    Py_DECREF(items);
    return out;
failed:
    PyMem_Free(s.seen);
    PyMem_Free(table.slots);
    PyMem_Free(row);
    Py_DECREF(items);
    Py_DECREF(out);
    return NULL;
}
