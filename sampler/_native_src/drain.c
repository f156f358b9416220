/* The drain, under the GIL: the ring's records counted into the sampler's table (count.c), each
 * under the key of its label set and its stack of frame name ids (drain_stacks.c). A record
 * with no stack (a thread waiting again where it was last read waiting, or one that ended with
 * CPU no tick noticed) counts under that thread's last key, kept in the drain target.
 */
#include "native.h"
#include "module.h"

#include <string.h>

/* Pops ``key`` from ``dict``: a new reference, or NULL (absent, or with an exception set). */
static PyObject *pop(PyObject *dict, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL) {
        return NULL;
    }
    Py_INCREF(value);
    if (PyDict_DelItem(dict, key) < 0) {
        Py_DECREF(value);
        return NULL;
    }
    return value;
}

static int forget(PyObject *dict, PyObject *key)
{
    PyObject *value = pop(dict, key);
    Py_XDECREF(value);
    return PyErr_Occurred() ? -1 : 0;
}

static int add(drain_state *state, PyObject *key, double weight)
{
    long long added = count_add(&state->sink, key, weight);
    state->added += added;
    return added < 0 ? -1 : 0;
}

/* A thread ended (its CPU no tick noticed goes where it was last seen, or to its entry stack)
 * or waited on where it was last read waiting. */
static int count_marker(drain_state *state, record_head *record, PyObject *ident)
{
    PyObject *key;
    if (record->flags & FLAG_EXIT) {
        key = pop(state->last_key, ident);
        if (key == NULL && !PyErr_Occurred()) {
            key = Py_XNewRef(PyDict_GetItemWithError(state->entry_key, ident));
        }
        if (PyErr_Occurred() || forget(state->entry_key, ident) < 0 ||
            forget(state->last_waiting, ident) < 0) {
            Py_XDECREF(key);
            return -1;
        }
    } else {
        key = Py_XNewRef(PyDict_GetItemWithError(state->last_waiting, ident));
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    if (key == NULL) {
        state->dropped += (long long)record->weight;
        return 0;
    }
    int result = add(state, key, (double)record->weight);
    Py_DECREF(key);
    return result;
}

static int count_sample(drain_state *state, record_head *record, PyObject *ident,
                        PyObject *label, PyObject *stack)
{
    if (record->flags & FLAG_ENTRY) {
        /* Its stack as it registered itself, less the hook that did it. A new thread may reuse
         * an ended one's ident: nothing of that one is kept. */
        PyObject *entry = untracked(PyTuple_GetSlice(stack, 1, PyTuple_GET_SIZE(stack)));
        PyObject *key = entry == NULL ? NULL : untracked(PyTuple_Pack(2, label, entry));
        Py_XDECREF(entry);
        int result = key == NULL || PyDict_SetItem(state->entry_key, ident, key) < 0 ||
                             forget(state->last_key, ident) < 0 ||
                             forget(state->last_waiting, ident) < 0
                         ? -1
                         : 0;
        Py_XDECREF(key);
        return result;
    }
    PyObject *key = untracked(PyTuple_Pack(2, label, stack));
    /* A thread mostly stays where it was (busy in one place, or waiting): its last key then
     * stands for this one, so the samples kept a while (recent) hold one tuple between them,
     * not a stack's each (~530 bytes a sample, 4.4 MB for the 8,192 kept). */
    PyObject *last = key == NULL ? NULL : PyDict_GetItemWithError(state->last_key, ident);
    int same = last != NULL ? PyObject_RichCompareBool(last, key, Py_EQ) : 0;
    if (same > 0) {
        Py_SETREF(key, Py_NewRef(last));
    }
    if (key == NULL || PyErr_Occurred() || PyDict_SetItem(state->last_key, ident, key) < 0) {
        Py_XDECREF(key);
        return -1;
    }
    double weight = (double)record->weight;
    uint32_t on_cpu = record->flags >> FLAG_ON_CPU_SHIFT;
    int result = 0;
    if (record->flags & FLAG_WAITING) {
        result = PyDict_SetItem(state->last_waiting, ident, key);
    } else if (on_cpu) {
        /* Wall mode: the thread ran for this share of its interval and waited (for a core,
         * or otherwise) for the rest, where it is now. */
        double running = weight * on_cpu / 1000.0;
        PyObject *marked = waiting_stack(stack, FLAG_REASON(record->flags));
        if (marked == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *waited = untracked(PyTuple_Pack(2, label, marked));
        Py_DECREF(marked);
        result = waited == NULL ? -1 : add(state, waited, weight - running);
        Py_XDECREF(waited);
        weight = running;
    }
    if (result == 0) {
        result = add(state, key, weight);
    }
    if (result == 0 && state->recent != Py_None) {
        /* Kept a while, so a stall or a slow request can find what its thread was doing. */
        PyObject *sample = untracked(Py_BuildValue("(dOOd)", (double)record->time_ns / 1e9,
                                                   ident, key, (double)record->weight));
        PyObject *done = sample == NULL ? NULL : PyObject_CallOneArg(state->recent, sample);
        Py_XDECREF(sample);
        result = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(key);
    return result;
}

static int visit(record_head *record, void *arg)
{
    drain_state *state = arg;
    PyObject *ident = PyLong_FromUnsignedLong((unsigned long)record->ident);
    if (ident == NULL) {
        return -1;
    }
    int result;
    if (record->flags & (FLAG_REPEAT | FLAG_EXIT)) {
        result = count_marker(state, record, ident);
    } else {
        record_frame *frames = (record_frame *)(record + 1);
        PyObject *stack = stack_of(state, record, frames);
        PyObject *label = stack == NULL ? NULL : label_of(record);
        if (label != NULL && state->thread_root != Py_None) {
            PyObject *root = PyObject_CallOneArg(state->thread_root, ident);
            PyObject *rooted = root == NULL ? NULL : PyTuple_New(PyTuple_GET_SIZE(stack) + 1);
            if (rooted != NULL) {
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(stack); i++) {
                    PyTuple_SET_ITEM(rooted, i, Py_NewRef(PyTuple_GET_ITEM(stack, i)));
                }
                PyTuple_SET_ITEM(rooted, PyTuple_GET_SIZE(stack), Py_NewRef(root));
            }
            Py_XDECREF(root);
            Py_SETREF(stack, untracked(rooted));
        }
        result = stack == NULL || label == NULL
                     ? -1
                     : count_sample(state, record, ident, label, stack);
        Py_XDECREF(stack);
        Py_XDECREF(label);
    }
    Py_DECREF(ident);
    state->records++;
    return result;
}

/* Reads the attributes of ``table`` (a sampler._engine_native.DrainTarget) into the state. */
static int read_target(drain_state *state, PyObject *target)
{
    PyObject *max_stacks = PyObject_GetAttrString(target, "max_stacks");
    state->sink.max_stacks = max_stacks == NULL ? -1 : PyLong_AsSsize_t(max_stacks);
    Py_XDECREF(max_stacks);
    PyObject **fields[] = {&state->sink.counts,   &state->sink.touched, &state->sink.residues,
                           &state->sink.generation, &state->sink.other, &state->thread_root,
                           &state->last_key,      &state->entry_key,   &state->last_waiting,
                           &state->recent};
    const char *names[] = {"counts", "touched", "residues", "generation", "other", "thread_root",
                           "last_key", "entry_key", "last_waiting", "recent"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *fields[i] = PyObject_GetAttrString(target, names[i]);
        if (*fields[i] == NULL) {
            return -1;
        }
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *dicts[] = {state->sink.counts, state->sink.touched, state->sink.residues,
                         state->last_key, state->entry_key, state->last_waiting};
    for (size_t i = 0; i < sizeof(dicts) / sizeof(dicts[0]); i++) {
        if (!PyDict_Check(dicts[i])) {
            PyErr_SetString(PyExc_TypeError, "drain target: expected dicts");
            return -1;
        }
    }
    if (!PyTuple_Check(state->sink.other)) {
        PyErr_SetString(PyExc_TypeError, "drain target: other must be a tuple");
        return -1;
    }
    return 0;
}

static void release_target(drain_state *state)
{
    Py_CLEAR(state->sink.counts);
    Py_CLEAR(state->sink.touched);
    Py_CLEAR(state->sink.residues);
    Py_CLEAR(state->sink.generation);
    Py_CLEAR(state->sink.other);
    Py_CLEAR(state->thread_root);
    Py_CLEAR(state->last_key);
    Py_CLEAR(state->entry_key);
    Py_CLEAR(state->last_waiting);
    Py_CLEAR(state->recent);
}

static uint64_t drain_random = 0x2545f4914f6cdd1dull;

PyObject *native_drain(PyObject *module, PyObject *args)
{
    (void)module;
    drain_state state;
    memset(&state, 0, sizeof(state));
    PyObject *target;
    if (!PyArg_ParseTuple(args, "OO", &state.resolve, &target)) {
        return NULL;
    }
    if (ring.data == NULL || truncated_id == NULL) {
        return Py_BuildValue("(nLLK)", (Py_ssize_t)0, 0LL, 0LL, 0ULL);
    }
    if (read_target(&state, target) < 0) {
        release_target(&state);
        return NULL;
    }
    if (engine_started && engine_wall) {
        threads_flush_repeats();
    }
    state.sink.random = drain_random;
    freed_drain_begins();
    Py_ssize_t visited = ring_consume(&ring, visit, &state);
    drain_random = state.sink.random;
    freed_release();
    uint64_t freeing_ns = freed_drained(!engine_started);
    tags_collect();
    release_target(&state);
    if (visited < 0) {
        return NULL;
    }
    return Py_BuildValue("(nLLK)", state.records, state.added, state.dropped,
                         (unsigned long long)freeing_ns);
}
