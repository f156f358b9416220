/* TimedCall, the stall watcher's timing of a call in C (sampler/_stall_timing.py's
 * python_timed is the same in Python): an asyncio callback or a WSGI server's request, timed
 * by two clock reads and kept in the watcher's running dict (thread ident -> (kind, started))
 * while it runs; past its limit the watcher is told. An asyncio service runs one for every
 * callback of its loop (11 a request over a new connection under uvicorn), so the Python
 * closure's ~0.26 us each was most of what stall watching cost it. Everything here runs under
 * the GIL.
 */
#include "middleware.h"
#include "module.h"

#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *original; /* the method timed */
    PyObject *kind;     /* "event-loop" or "request" */
    PyObject *running;  /* the watcher's running dict */
    PyObject *watcher;  /* read for the limit at each call: tests and users may change it */
    PyObject *limit;    /* the name of the watcher's attribute holding the limit (seconds) */
    PyObject *finished; /* finished(kind, ident, started, elapsed, what) */
    PyObject *describe; /* describe(args) -> what, on the host's thread, past the limit only */
    PyObject *ident;    /* the last caller's thread ident as an int: an event loop's, mostly */
    unsigned long ident_value;
    vectorcallfunc vectorcall;
} TimedCall;

/* Puts the running dict's entry for ``ident`` back as it was (``outer``, or none). */
static int restore(PyObject *running, PyObject *ident, PyObject *outer)
{
    if (outer != NULL) {
        return PyDict_SetItem(running, ident, outer);
    }
    if (PyDict_DelItem(running, ident) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

/* Tells the watcher of a call that ran ``elapsed`` seconds, if that is past its limit. */
static int tell(TimedCall *self, PyObject *ident, double started, double elapsed,
                PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *limit = PyObject_GetAttr(self->watcher, self->limit);
    double seconds = limit == NULL ? -1.0 : PyFloat_AsDouble(limit);
    Py_XDECREF(limit);
    if (seconds == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (elapsed <= seconds) {
        return 0;
    }
    PyObject *positional = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; positional != NULL && i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(positional, i, args[i]);
    }
    PyObject *what = positional == NULL ? NULL : PyObject_CallOneArg(self->describe, positional);
    Py_XDECREF(positional);
    if (what == NULL) {
        return -1;
    }
    PyObject *result = PyObject_CallFunction(self->finished, "OOddO", self->kind, ident, started,
                                             elapsed, what);
    Py_DECREF(what);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

static PyObject *TimedCall_vectorcall(TimedCall *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    unsigned long ident_value = PyThread_get_thread_ident();
    if (self->ident == NULL || self->ident_value != ident_value) {
        PyObject *made = PyLong_FromUnsignedLong(ident_value);
        if (made == NULL) {
            return NULL;
        }
        Py_XSETREF(self->ident, made);
        self->ident_value = ident_value;
    }
    PyObject *ident = Py_NewRef(self->ident);
    PyObject *outer = PyDict_GetItemWithError(self->running, ident);
    Py_XINCREF(outer);
    double started = monotonic_now();
    PyObject *clock = PyErr_Occurred() ? NULL : PyFloat_FromDouble(started);
    PyObject *entry = clock == NULL ? NULL : PyTuple_Pack(2, self->kind, clock);
    Py_XDECREF(clock);
    if (entry == NULL || PyDict_SetItem(self->running, ident, entry) < 0) {
        Py_XDECREF(entry);
        Py_XDECREF(outer);
        Py_DECREF(ident);
        return NULL;
    }
    Py_DECREF(entry);
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    /* As the Python wrapper's `finally`: whatever the call did, its error kept unless the
     * ending itself fails. */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int failed = restore(self->running, ident, outer) < 0 ||
                 tell(self, ident, started, monotonic_now() - started, args,
                      PyVectorcall_NARGS(nargsf)) < 0;
    Py_XDECREF(outer);
    Py_DECREF(ident);
    if (failed) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_CLEAR(result);
        return NULL;
    }
    PyErr_Restore(type, value, traceback);
    return result;
}

static PyObject *TimedCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *kind, *running, *watcher, *limit, *finished, *describe;
    if ((kwargs != NULL && !_PyArg_NoKeywords("TimedCall", kwargs)) ||
        !PyArg_ParseTuple(args, "OUO!OUOO:TimedCall", &original, &kind, &PyDict_Type, &running,
                          &watcher, &limit, &finished, &describe)) {
        return NULL;
    }
    TimedCall *self = (TimedCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **slots[] = {&self->original, &self->kind,     &self->running, &self->watcher,
                          &self->limit,    &self->finished, &self->describe};
    PyObject *given[] = {original, kind, running, watcher, limit, finished, describe};
    for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++) {
        Py_INCREF(given[i]);
        *slots[i] = given[i];
    }
    self->vectorcall = (vectorcallfunc)TimedCall_vectorcall;
    return (PyObject *)self;
}

static int TimedCall_traverse(TimedCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->kind);
    Py_VISIT(self->running);
    Py_VISIT(self->watcher);
    Py_VISIT(self->limit);
    Py_VISIT(self->finished);
    Py_VISIT(self->describe);
    Py_VISIT(self->ident);
    return 0;
}

static int TimedCall_clear(TimedCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->running);
    Py_CLEAR(self->watcher);
    Py_CLEAR(self->limit);
    Py_CLEAR(self->finished);
    Py_CLEAR(self->describe);
    Py_CLEAR(self->ident);
    return 0;
}

static void TimedCall_dealloc(TimedCall *self)
{
    PyObject_GC_UnTrack(self);
    TimedCall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Bound as a function is when read from an instance: it stands for a method. */
static PyObject *TimedCall_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    (void)owner;
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, instance);
}

static PyObject *TimedCall_is_timed(PyObject *self, void *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_TRUE;
}

static PyMemberDef TimedCall_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(TimedCall, original), READONLY, "the method timed"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef TimedCall_getset[] = {
    {"__fleetflame_timed__", TimedCall_is_timed, NULL, "True: a stall watcher's timing", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TimedCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.TimedCall",
    .tp_basicsize = sizeof(TimedCall),
    .tp_dealloc = (destructor)TimedCall_dealloc,
    .tp_vectorcall_offset = offsetof(TimedCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "TimedCall(original, kind, running, watcher, limit, finished, describe): a method "
              "timed for the stall watcher (sampler/_stall_timing.py's python_timed, in C).",
    .tp_traverse = (traverseproc)TimedCall_traverse,
    .tp_clear = (inquiry)TimedCall_clear,
    .tp_new = TimedCall_new,
    .tp_descr_get = TimedCall_get,
    .tp_members = TimedCall_members,
    .tp_getset = TimedCall_getset,
};
