/* Counting drained samples into the sampler's table, in C: the drain's hot loop.
 *
 * The same rules as StackTable.add (sampler/_stacks.py), which the python engine uses: counts
 * are whole samples; a fractional weight's remainder is carried with its stack and rounded up
 * with its own probability; past max_stacks new stacks count under [other]; every count
 * changed is marked with the table's generation. Here a stack key is hashed once per sample
 * (a 50-frame tuple costs hundreds of instructions to hash, and the Python version hashed it
 * four times).
 */
#include "native.h"

static double next_unit(count_sink *sink)
{
    sink->random ^= sink->random << 13;
    sink->random ^= sink->random >> 7;
    sink->random ^= sink->random << 17;
    return (double)(sink->random >> 11) / 9007199254740992.0; /* 2**53 */
}

/* The key past max_stacks: the same label set, the [other] stack. */
static PyObject *overflow_key(count_sink *sink, PyObject *key)
{
    return PyTuple_Pack(2, PyTuple_GET_ITEM(key, 0), sink->other);
}

static int carry(count_sink *sink, PyObject *key, Py_hash_t hash, double fraction,
                 long long *count)
{
    PyObject *held = _PyDict_GetItem_KnownHash(sink->residues, key, hash);
    if (held == NULL && PyErr_Occurred()) {
        return -1;
    }
    double residue = (held != NULL ? PyFloat_AsDouble(held) : 0.0) + fraction;
    if (residue > 0.0 && next_unit(sink) < residue) {
        *count += 1;
        residue -= 1.0;
    }
    PyObject *value = PyFloat_FromDouble(residue);
    if (value == NULL) {
        return -1;
    }
    int result = _PyDict_SetItem_KnownHash(sink->residues, key, value, hash);
    Py_DECREF(value);
    return result;
}

long long count_add(count_sink *sink, PyObject *key, double weight)
{
    Py_INCREF(key);
    Py_hash_t hash = PyObject_Hash(key);
    PyObject *old = hash == -1 ? NULL : _PyDict_GetItem_KnownHash(sink->counts, key, hash);
    if (old == NULL && !PyErr_Occurred() && PyDict_GET_SIZE(sink->counts) >= sink->max_stacks) {
        Py_SETREF(key, overflow_key(sink, key));
        hash = key == NULL ? -1 : PyObject_Hash(key);
        old = hash == -1 ? NULL : _PyDict_GetItem_KnownHash(sink->counts, key, hash);
    }
    if (PyErr_Occurred()) {
        Py_XDECREF(key);
        return -1;
    }
    long long count = (long long)weight;
    if (weight != (double)count && carry(sink, key, hash, weight - (double)count, &count) < 0) {
        Py_DECREF(key);
        return -1;
    }
    if (count <= 0) {
        Py_DECREF(key);
        return 0;
    }
    long long total = count;
    if (old != NULL) {
        total += PyLong_AsLongLong(old);
    }
    PyObject *value = PyLong_FromLongLong(total);
    int failed = value == NULL || _PyDict_SetItem_KnownHash(sink->counts, key, value, hash) < 0 ||
                 _PyDict_SetItem_KnownHash(sink->touched, key, sink->generation, hash) < 0;
    Py_XDECREF(value);
    Py_DECREF(key);
    return failed ? -1 : count;
}
