/* RunningCalls, the stall watcher's table of the calls running now (timed.c's TimedCall
 * writes it, the watcher reads it: sampler/_stalls.py, watch.c), and the limits it judges
 * them by. The Python wrapper (sampler/_stall_timing.py) keeps a dict of the same: thread
 * ident -> (kind, monotonic start). Here a call costs no object: a slot per thread, found by
 * a scan of the slots in use (a thread or two on an event loop; a worker's threads on a
 * threaded WSGI server), held from the thread's outermost timed call to its end. A dict's
 * entry, its tuple and float and the limit's attribute read cost ~1,000 instructions a call;
 * an asyncio service makes 11 timed calls a request. Everything here runs under the GIL.
 */
#include "middleware.h"
#include "module.h"

static const char *const kind_names[KINDS] = {"event-loop", "request"};
static PyObject *kind_strings[KINDS];

/* The kind a name stands for, or -1 with a ValueError set. */
int running_kind(PyObject *name)
{
    for (int kind = 0; kind < KINDS; kind++) {
        int same = PyUnicode_Check(name) ? PyUnicode_CompareWithASCIIString(name, kind_names[kind])
                                         : -1;
        if (same == 0) {
            return kind;
        }
    }
    PyErr_Format(PyExc_ValueError, "a timed call's kind is 'event-loop' or 'request', not %R",
                 name);
    return -1;
}

/* With more slots in use than this, a thread first tries the slot it was given last. */
#define SCAN_FIRST 16

/* The slot this thread was given last, and by which table: while the thread holds a slot it
 * is that one (nested calls are given it again), and once given back it is free or another
 * thread's. A scan of 200 threads' slots cost ~1,500 instructions a call. */
static __thread struct {
    const RunningCalls *table;
    Py_ssize_t at;
} last_given;

static Py_ssize_t running_scan(RunningCalls *running, unsigned long ident);

/* The slot of the thread ``ident``: its own if it has one (a nested call), else a free one
 * (then its ident is 0). -1 with MemoryError set when none is left and the table cannot grow. */
Py_ssize_t running_slot(RunningCalls *running, unsigned long ident)
{
    Py_ssize_t at = last_given.at;
    if (running->used > SCAN_FIRST && last_given.table == running && at >= 0) {
        if (at < running->used &&
            (running->slots[at].ident == ident || running->slots[at].ident == 0)) {
            return at;
        }
        if (at == running->used && at < running->capacity) {
            /* The last slot, given back (the table's end moved back over it): taken again. A
             * thread holding a slot is given it again above, so it holds none now. */
            running->slots[at] = (running_call){0, 0.0, 0, 0};
            running->used++;
            return at;
        }
    }
    at = running_scan(running, ident);
    if (at >= 0) { /* not when the table could not grow (-1): no slot was given */
        last_given.table = running;
        last_given.at = at;
    }
    return at;
}

static Py_ssize_t running_scan(RunningCalls *running, unsigned long ident)
{
    Py_ssize_t free_slot = -1;
    for (Py_ssize_t i = 0; i < running->used; i++) {
        unsigned long held = running->slots[i].ident;
        if (held == ident) {
            return i;
        }
        if (held == 0 && free_slot < 0) {
            free_slot = i;
        }
    }
    if (free_slot >= 0) {
        return free_slot;
    }
    if (running->used == running->capacity) {
        Py_ssize_t capacity = running->capacity ? running->capacity * 2 : 8;
        running_call *slots = PyMem_Realloc(running->slots, capacity * sizeof(running_call));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        running->slots = slots;
        running->capacity = capacity;
    }
    running->slots[running->used] = (running_call){0, 0.0, 0, 0};
    return running->used++;
}

/* Gives the slot at ``at`` back (its thread's outermost call ended). */
void running_free(RunningCalls *running, Py_ssize_t at)
{
    running->slots[at] = (running_call){0, 0.0, 0, 0};
    while (running->used > 0 && running->slots[running->used - 1].ident == 0) {
        running->used--;
    }
}

int running_check(PyObject *object)
{
    return PyObject_TypeCheck(object, &RunningCallsType);
}

/* As PyDict_Next over the calls running: 1 and the next one's thread, kind and start, or 0. */
int running_next(PyObject *object, Py_ssize_t *pos, unsigned long *ident, int *kind,
                 double *started)
{
    RunningCalls *running = (RunningCalls *)object;
    for (; *pos < running->used; (*pos)++) {
        running_call *call = &running->slots[*pos];
        if (call->ident != 0) {
            *ident = call->ident;
            *kind = call->kind;
            *started = call->started;
            (*pos)++;
            return 1;
        }
    }
    return 0;
}

/* The calls running now, as the Python wrapper's dict: thread ident -> (kind, start). */
static PyObject *RunningCalls_copy(RunningCalls *running, PyObject *unused)
{
    (void)unused;
    PyObject *calls = PyDict_New();
    Py_ssize_t pos = 0;
    unsigned long ident;
    int kind;
    double started;
    while (calls != NULL && running_next((PyObject *)running, &pos, &ident, &kind, &started)) {
        PyObject *key = PyLong_FromUnsignedLong(ident);
        PyObject *call = Py_BuildValue("(Od)", kind_strings[kind], started);
        if (key == NULL || call == NULL || PyDict_SetItem(calls, key, call) < 0) {
            Py_CLEAR(calls);
        }
        Py_XDECREF(key);
        Py_XDECREF(call);
    }
    return calls;
}

static PyObject *RunningCalls_items(RunningCalls *running, PyObject *unused)
{
    PyObject *calls = RunningCalls_copy(running, unused);
    PyObject *items = calls == NULL ? NULL : PyDict_Items(calls);
    Py_XDECREF(calls);
    return items;
}

static Py_ssize_t RunningCalls_length(RunningCalls *running)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < running->used; i++) {
        count += running->slots[i].ident != 0;
    }
    return count;
}

/* set_limit(kind, seconds): a call of the kind that runs longer is told to the watcher. */
static PyObject *RunningCalls_set_limit(RunningCalls *running, PyObject *args)
{
    PyObject *name;
    double seconds;
    if (!PyArg_ParseTuple(args, "Od:set_limit", &name, &seconds)) {
        return NULL;
    }
    int kind = running_kind(name);
    if (kind < 0) {
        return NULL;
    }
    running->limits[kind] = seconds;
    Py_RETURN_NONE;
}

static PyObject *RunningCalls_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_UnpackTuple(args, "RunningCalls", 0, 0) ||
        (kwargs != NULL && !_PyArg_NoKeywords("RunningCalls", kwargs))) {
        return NULL;
    }
    for (int kind = 0; kind < KINDS; kind++) {
        if (kind_strings[kind] == NULL &&
            (kind_strings[kind] = PyUnicode_InternFromString(kind_names[kind])) == NULL) {
            return NULL;
        }
    }
    RunningCalls *running = (RunningCalls *)type->tp_alloc(type, 0);
    if (running != NULL) {
        for (int kind = 0; kind < KINDS; kind++) {
            running->limits[kind] = Py_HUGE_VAL; /* none told until the watcher sets them */
        }
    }
    return (PyObject *)running;
}

static void RunningCalls_dealloc(RunningCalls *running)
{
    PyMem_Free(running->slots);
    Py_TYPE(running)->tp_free((PyObject *)running);
}

static PyMethodDef RunningCalls_methods[] = {
    {"copy", (PyCFunction)RunningCalls_copy, METH_NOARGS,
     "The calls running now: {thread ident: (kind, monotonic start)}."},
    {"items", (PyCFunction)RunningCalls_items, METH_NOARGS,
     "The calls running now: [(thread ident, (kind, monotonic start))]."},
    {"set_limit", (PyCFunction)RunningCalls_set_limit, METH_VARARGS,
     "set_limit(kind, seconds): a call of the kind running longer is a stall."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods RunningCalls_sequence = {
    .sq_length = (lenfunc)RunningCalls_length,
};

PyTypeObject RunningCallsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RunningCalls",
    .tp_basicsize = sizeof(RunningCalls),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RunningCalls(): the calls TimedCall times, running now, and their limits.",
    .tp_new = RunningCalls_new,
    .tp_dealloc = (destructor)RunningCalls_dealloc,
    .tp_methods = RunningCalls_methods,
    .tp_as_sequence = &RunningCalls_sequence,
};
