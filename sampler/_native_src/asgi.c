/* The ASGI middleware's per-request parts that cost most in Python (sampler/middleware/_asgi.py):
 * finding the request-start header among the request's headers, and the ``send`` that notes
 * the response's status on its way to the server's. */
#include "asgi.h"
#include "module.h"

#include <stddef.h>
#include <string.h>

static int is_start_header(PyObject *name)
{
    if (!PyBytes_Check(name)) {
        return 0;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(name);
    const char *text = PyBytes_AS_STRING(name);
    return (size == 15 && memcmp(text, "x-request-start", 15) == 0) ||
           (size == 13 && memcmp(text, "x-queue-start", 13) == 0);
}

/* asgi_request_start(headers): the value of the first X-Request-Start or X-Queue-Start header
 * of an ASGI scope's headers (tuples or lists of two bytes, the name in lower case), decoded as
 * Latin-1; None if there is none. A pair of another shape, a name or value not bytes, is passed
 * over (as by the Python path, python_request_start). */
PyObject *native_asgi_request_start(PyObject *module, PyObject *headers)
{
    (void)module;
    PyObject *pairs = PySequence_Fast(headers, "asgi_request_start() takes the scope's headers");
    if (pairs == NULL) {
        return NULL;
    }
    PyObject *found = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(pairs);
    PyObject **items = PySequence_Fast_ITEMS(pairs);
    for (Py_ssize_t i = 0; i < count && found == NULL; i++) {
        PyObject *pair = items[i];
        PyObject *name, *value;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
            name = PyTuple_GET_ITEM(pair, 0), value = PyTuple_GET_ITEM(pair, 1);
        } else if (PyList_Check(pair) && PyList_GET_SIZE(pair) == 2) {
            name = PyList_GET_ITEM(pair, 0), value = PyList_GET_ITEM(pair, 1);
        } else {
            continue;
        }
        if (is_start_header(name) && PyBytes_Check(value)) {
            found = PyUnicode_DecodeLatin1(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value),
                                           NULL);
            if (found == NULL) {
                Py_DECREF(pairs);
                return NULL;
            }
        }
    }
    Py_DECREF(pairs);
    return found != NULL ? found : Py_NewRef(Py_None);
}

/* -- StatusSend -------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *send;  /* the server's send */
    PyObject *state; /* the request's [route, status, answered] list */
    vectorcallfunc vectorcall;
} StatusSend;

static PyObject *str_type, *str_status, *str_start, *str_body, *str_more_body, *str_get, *absent;
static PyObject *str_pathsend, *str_trailers;

/* message.get(key): a new reference; NULL with *failed 0 when absent, NULL with *failed 1 and
 * an exception set on error. A mapping other than a dict is asked with a default of its own,
 * so a key present with None is present, as for the Python path. */
static PyObject *message_get(PyObject *message, PyObject *key, int *failed)
{
    PyObject *value;
    if (PyDict_CheckExact(message)) {
        value = Py_XNewRef(PyDict_GetItemWithError(message, key));
    } else {
        value = PyObject_CallMethodObjArgs(message, str_get, key, absent, NULL);
        if (value == absent) {
            Py_CLEAR(value);
        }
    }
    *failed = value == NULL && PyErr_Occurred() != NULL;
    return value;
}

/* Notes an http.response.start message: state[1] = message.get("status", 0), as the Python
 * path's send does, and state[2] = None when trailers will follow the body (then the app's
 * return, not the last body, ends the request). */
static int note_start(StatusSend *self, PyObject *message)
{
    int failed;
    PyObject *status = message_get(message, str_status, &failed);
    if (failed || (status == NULL && (status = PyLong_FromLong(0)) == NULL)) {
        return -1;
    }
    int set = PySequence_SetItem(self->state, 1, status);
    Py_DECREF(status);
    PyObject *trailers = set < 0 ? NULL : message_get(message, str_trailers, &failed);
    if (set < 0 || failed) {
        return -1;
    }
    int later = trailers != NULL ? PyObject_IsTrue(trailers) : 0;
    Py_XDECREF(trailers);
    if (later <= 0) {
        return later;
    }
    return PySequence_SetItem(self->state, 2, Py_None);
}

/* What a message is to its request: 1 the answer's last (a body with no more to come, or a
 * pathsend), whose send then ends the request; 0 any other; -1 on an error. */
static int note_message(StatusSend *self, PyObject *message)
{
    int failed;
    PyObject *kind = message_get(message, str_type, &failed);
    if (failed) {
        return -1;
    }
    int is_str = kind != NULL && PyUnicode_Check(kind);
    int start = is_str && PyUnicode_Compare(kind, str_start) == 0;
    int body = is_str && !start && PyUnicode_Compare(kind, str_body) == 0;
    int pathsend = is_str && !start && !body && PyUnicode_Compare(kind, str_pathsend) == 0;
    Py_XDECREF(kind);
    if (start) {
        return note_start(self, message);
    }
    if (body) {
        PyObject *more = message_get(message, str_more_body, &failed);
        if (failed) {
            return -1;
        }
        int more_coming = more != NULL ? PyObject_IsTrue(more) : 0;
        Py_XDECREF(more);
        if (more_coming != 0) {
            return more_coming < 0 ? -1 : 0;
        }
    } else if (!pathsend) {
        return 0;
    }
    PyObject *answered = PySequence_GetItem(self->state, 2);
    if (answered == NULL) {
        return -1;
    }
    int watched = answered != Py_None; /* None: trailers follow */
    Py_DECREF(answered);
    return watched;
}

/* sampler.middleware._asgi's _answered(sending, state): awaits the server's send of the
 * answer's last message, then notes the time in state[2] (for a send that gives an awaitable
 * other than a coroutine). Bound by asgi_answered(). */
static PyObject *answered_send;

/* The answer's last message was sent: state[2] = now (a send that failed notes nothing). */
static int answer_end(Awaiting *self, int failed)
{
    if (failed) {
        return 0;
    }
    PyObject *now = PyFloat_FromDouble(monotonic_now());
    if (now == NULL) {
        return -1;
    }
    int set = PySequence_SetItem(self->state, 2, now);
    Py_DECREF(now);
    return set;
}

/* The answer's last message's send, awaited: notes its end in state[2]. */
static PyObject *answering(PyObject *sending, PyObject *state)
{
    Awaiting *self = awaiting_new(NULL, answer_end);
    if (self != NULL) {
        self->inner = Py_NewRef(sending);
        self->state = Py_NewRef(state);
        self->gives_result = 1; /* as _answered gives what the send gave */
    }
    return (PyObject *)self;
}

/* The message is the one argument, by position or by name (send(message=...)). */
static PyObject *StatusSend_call(StatusSend *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    if (self->send == NULL || self->state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StatusSend: cleared");
        return NULL;
    }
    Py_ssize_t given = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    int last = given == 1 ? note_message(self, args[0]) : 0;
    if (last < 0) {
        return NULL;
    }
    PyObject *sending = PyObject_Vectorcall(self->send, args, nargsf, kwnames);
    if (sending == NULL || !last || answered_send == NULL) {
        return sending;
    }
    /* The request ends when the server has sent its answer: a send that fails leaves it a
     * failure, as in the Python path. A coroutine (as most servers' sends give) is awaited
     * in C (an Awaiting, asgi_await.c); any other awaitable by the Python path's coroutine. */
    PyObject *awaited = PyCoro_CheckExact(sending)
                            ? answering(sending, self->state)
                            : PyObject_CallFunctionObjArgs(answered_send, sending, self->state, NULL);
    Py_DECREF(sending);
    return awaited;
}

static PyTypeObject StatusSendType;

/* StatusSend(send, state), for the C path's request (asgi_request.c). */
PyObject *asgi_status_send(PyObject *send, PyObject *state)
{
    StatusSend *self = (StatusSend *)StatusSendType.tp_alloc(&StatusSendType, 0);
    if (self == NULL) {
        return NULL;
    }
    self->send = Py_NewRef(send);
    self->state = Py_NewRef(state);
    self->vectorcall = (vectorcallfunc)StatusSend_call;
    return (PyObject *)self;
}

static PyObject *StatusSend_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *send, *state;
    if (!PyArg_UnpackTuple(args, "StatusSend", 2, 2, &send, &state) ||
        (kwargs != NULL && !_PyArg_NoKeywords("StatusSend", kwargs))) {
        return NULL;
    }
    return asgi_status_send(send, state); /* not a base type: type is StatusSendType */
}

static int StatusSend_traverse(StatusSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->send);
    Py_VISIT(self->state);
    return 0;
}

static int StatusSend_clear(StatusSend *self)
{
    Py_CLEAR(self->send);
    Py_CLEAR(self->state);
    return 0;
}

static void StatusSend_dealloc(StatusSend *self)
{
    PyObject_GC_UnTrack(self);
    StatusSend_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StatusSendType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.StatusSend",
    .tp_basicsize = sizeof(StatusSend),
    .tp_dealloc = (destructor)StatusSend_dealloc,
    .tp_vectorcall_offset = offsetof(StatusSend, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "StatusSend(send, state): the ASGI send a request's app is given; notes the "
              "response's status in state[1], passes every message on to send, and hands "
              "the answer's last to asgi_answered's function.",
    .tp_traverse = (traverseproc)StatusSend_traverse,
    .tp_clear = (inquiry)StatusSend_clear,
    .tp_new = StatusSend_new,
};

/* asgi_mark(marks): sets each name of the dict ``marks`` on StatusSend (the markers asyncio
 * and inspect look for on a callable whose call returns an awaitable: the middleware sets
 * them, so that importing the extension need not import asyncio). */
PyObject *native_asgi_mark(PyObject *module, PyObject *marks)
{
    (void)module;
    if (!PyDict_Check(marks)) {
        PyErr_SetString(PyExc_TypeError, "asgi_mark() takes a dict");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(marks, &pos, &name, &value)) {
        if (!PyUnicode_Check(name) || PyDict_SetItem(StatusSendType.tp_dict, name, value) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "asgi_mark(): names are strings");
            }
            return NULL;
        }
    }
    PyType_Modified(&StatusSendType);
    Py_RETURN_NONE;
}

/* asgi_answered(function): the coroutine function the send hands the answer's last message
 * to (sampler.middleware._asgi's _answered). */
PyObject *native_asgi_answered(PyObject *module, PyObject *function)
{
    (void)module;
    if (!PyCallable_Check(function)) {
        PyErr_SetString(PyExc_TypeError, "asgi_answered: a callable");
        return NULL;
    }
    Py_XSETREF(answered_send, Py_NewRef(function));
    Py_RETURN_NONE;
}

int asgi_add_types(PyObject *module)
{
    if ((str_type = PyUnicode_InternFromString("type")) == NULL ||
        (str_status = PyUnicode_InternFromString("status")) == NULL ||
        (str_start = PyUnicode_InternFromString("http.response.start")) == NULL ||
        (str_body = PyUnicode_InternFromString("http.response.body")) == NULL ||
        (str_more_body = PyUnicode_InternFromString("more_body")) == NULL ||
        (str_pathsend = PyUnicode_InternFromString("http.response.pathsend")) == NULL ||
        (str_trailers = PyUnicode_InternFromString("trailers")) == NULL ||
        (str_get = PyUnicode_InternFromString("get")) == NULL ||
        (absent = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL ||
        PyType_Ready(&StatusSendType) < 0 || asgi_await_ready() < 0 ||
        asgi_request_ready() < 0 || asgi_route_add_type(module) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "StatusSend", (PyObject *)&StatusSendType);
}
