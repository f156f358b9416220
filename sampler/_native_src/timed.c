/* TimedCall, the stall watcher's timing of a call in C (sampler/_stall_timing.py's
 * python_timed is the same in Python): an asyncio callback or a WSGI server's request, timed
 * by two clock reads and kept in the watcher's table of running calls (running_calls.c) while
 * it runs; past its kind's limit the watcher is told. An asyncio service runs one for every
 * callback of its loop (11 a request over a new connection under uvicorn): the Python
 * closure cost ~0.26 us each, a dict entry from C ~0.1 us; this writes a slot, no object.
 * Everything here runs under the GIL.
 */
#include "middleware.h"
#include "module.h"

#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *original;     /* the method timed */
    PyObject *kind_name;    /* "event-loop" or "request" */
    RunningCalls *running;  /* the watcher's running calls, and their limits */
    PyObject *finished;     /* finished(kind, ident, started, elapsed, what) */
    PyObject *describe;     /* describe(args) -> what, on the host's thread, past the limit only */
    int kind;
    vectorcallfunc vectorcall;
} TimedCall;

/* Tells the watcher of a call that ran past its limit, its error (if any) kept, or when
 * telling fails the context of that failure. */
static int tell(TimedCall *self, unsigned long ident_value, double started, double elapsed,
                PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *ident = PyLong_FromUnsignedLong(ident_value);
    PyObject *positional = ident == NULL ? NULL : PyTuple_New(nargs);
    for (Py_ssize_t i = 0; positional != NULL && i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(positional, i, args[i]);
    }
    PyObject *what = positional == NULL ? NULL : PyObject_CallOneArg(self->describe, positional);
    Py_XDECREF(positional);
    PyObject *result = what == NULL ? NULL
                                    : PyObject_CallFunction(self->finished, "OOddO",
                                                            self->kind_name, ident, started,
                                                            elapsed, what);
    Py_XDECREF(what);
    Py_XDECREF(ident);
    Py_XDECREF(result);
    if (result == NULL) {
        _PyErr_ChainExceptions(type, value, traceback); /* the call's, as a finally's context */
        return -1;
    }
    PyErr_Restore(type, value, traceback);
    return 0;
}

static PyObject *TimedCall_vectorcall(TimedCall *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    RunningCalls *running = self->running;
    unsigned long ident = PyThread_get_thread_ident();
    Py_ssize_t at = running_slot(running, ident);
    if (at < 0) { /* no memory for the table to grow: the host's call runs, untimed */
        PyErr_Clear();
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    running->begun++;
    if (running->watcher_idle) { /* the watcher sleeps long, no call having begun for a while */
        running->watcher_idle = 0;
        gil_alarm_wake();
    }
    running_call outer = running->slots[at]; /* the thread's call this one runs in, if any */
    double started = monotonic_now();
    running->slots[at] = (running_call){ident, started, self->kind, 0};
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    double elapsed = monotonic_now() - started;
    /* The slot is still this call's when the calls made in it gave it back as they found it
     * (the table may have moved). Not when calls take turns on one OS thread (greenlets, under
     * gevent's monkey patching): one that began in this one runs on, or it ended and the slot
     * was given back, maybe taken by another thread's call since. Then the slot is left as it
     * is, marked when it holds this thread's call: the calls this one would give it back to
     * may have ended, so it is freed at that call's end, not given to them (a call missed
     * rather than one seen running for good). */
    running_call *slot = at < running->used ? &running->slots[at] : NULL;
    if (slot != NULL && slot->ident == ident && slot->started == started &&
        slot->kind == self->kind) {
        if (outer.ident == ident && !slot->interleaved) {
            *slot = outer;
        } else {
            running_free(running, at);
        }
    } else if (slot != NULL && slot->ident == ident) {
        slot->interleaved = 1;
    }
    if (elapsed > running->limits[self->kind] &&
        tell(self, ident, started, elapsed, args, PyVectorcall_NARGS(nargsf)) < 0) {
        Py_CLEAR(result);
    }
    return result;
}

static PyObject *TimedCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *kind_name, *running, *finished, *describe;
    if ((kwargs != NULL && !_PyArg_NoKeywords("TimedCall", kwargs)) ||
        !PyArg_ParseTuple(args, "OUO!OO:TimedCall", &original, &kind_name, &RunningCallsType,
                          &running, &finished, &describe)) {
        return NULL;
    }
    int kind = running_kind(kind_name);
    if (kind < 0) {
        return NULL;
    }
    TimedCall *self = (TimedCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->original = Py_NewRef(original);
    self->kind_name = Py_NewRef(kind_name);
    self->running = (RunningCalls *)Py_NewRef(running);
    self->finished = Py_NewRef(finished);
    self->describe = Py_NewRef(describe);
    self->kind = kind;
    self->vectorcall = (vectorcallfunc)TimedCall_vectorcall;
    return (PyObject *)self;
}

static int TimedCall_traverse(TimedCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->kind_name);
    Py_VISIT(self->running);
    Py_VISIT(self->finished);
    Py_VISIT(self->describe);
    return 0;
}

static int TimedCall_clear(TimedCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->kind_name);
    Py_CLEAR(self->running);
    Py_CLEAR(self->finished);
    Py_CLEAR(self->describe);
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

/* The timed method's own name, qualified name, module and doc, as functools.wraps gives a
 * wrapper: what tools that name or wrap the method (Handle._run) read. */
static PyObject *TimedCall_original_attribute(TimedCall *self, void *name)
{
    if (self->original == NULL) { /* cleared by the collector */
        PyErr_SetString(PyExc_AttributeError, (const char *)name);
        return NULL;
    }
    return PyObject_GetAttrString(self->original, (const char *)name);
}

static PyGetSetDef TimedCall_getset[] = {
    {"__fleetflame_timed__", TimedCall_is_timed, NULL, "True: a stall watcher's timing", NULL},
    {"__name__", (getter)TimedCall_original_attribute, NULL, "the method's", "__name__"},
    {"__qualname__", (getter)TimedCall_original_attribute, NULL, "the method's", "__qualname__"},
    {"__module__", (getter)TimedCall_original_attribute, NULL, "the method's", "__module__"},
    {"__doc__", (getter)TimedCall_original_attribute, NULL, "the method's", "__doc__"},
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
    .tp_doc = "TimedCall(original, kind, running, finished, describe): a method timed for the "
              "stall watcher (sampler/_stall_timing.py's python_timed, in C).",
    .tp_traverse = (traverseproc)TimedCall_traverse,
    .tp_clear = (inquiry)TimedCall_clear,
    .tp_new = TimedCall_new,
    .tp_descr_get = TimedCall_get,
    .tp_members = TimedCall_members,
    .tp_getset = TimedCall_getset,
};
