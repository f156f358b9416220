/* An ASGI request through a routed app (Starlette, FastAPI), as ASGIMiddleware's C path
 * (sampler/middleware/_asgi.py) runs it: what the Python path's coroutine does, by an object
 * that awaits the app's. Made, it notes the request's start and its request-start header,
 * puts the request's state in the scope and calls the app with a StatusSend; awaited, it
 * passes each step on to the app's coroutine; when that returns or raises (a cancellation,
 * a close), it hands the request to the recorder, as the Python path's ``finally`` does. It
 * has a coroutine's four methods (__await__, send, throw, close), so servers and asyncio
 * take it for one. A coroutine and its frame a request cost ~3,800 instructions. */
#include "native.h"
#include "middleware.h"
#include "module.h"

#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *inner;  /* the app's coroutine (or its awaitable's iterator) */
    PyObject *scope;
    PyObject *state;  /* [route, status, answered], also in the scope under KEY */
    PyObject *header; /* the request-start header's value, or None */
    double started, wall;
    char begun, ended;
} ASGIRequest;

/* Bound by asgi_bind(): the recorder, the route of requests no route named, the scope's key
 * of the state, and the recorder's queue bound. */
static PyObject *recorder, *unmatched, *state_key;
static Py_ssize_t max_pending;
static PyObject *str_headers, *str_path, *str_throw_name, *str_get_name;

static double realtime_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

/* scope.get(key): a new reference, or NULL (an error set only if the look-up failed). */
static PyObject *scope_get(PyObject *scope, PyObject *key)
{
    if (PyDict_CheckExact(scope)) {
        return Py_XNewRef(PyDict_GetItemWithError(scope, key));
    }
    PyObject *value = PyObject_CallMethodObjArgs(scope, str_get_name, key, NULL);
    if (value == Py_None) {
        Py_CLEAR(value);
    }
    return value;
}

/* The request's end, once: its Finished tuple to the recorder. ``failed``: the app raised
 * (or was closed) before the answer was sent, so the status is 0. */
static int request_end(ASGIRequest *self, int failed)
{
    if (self->ended) {
        return 0;
    }
    self->ended = 1;
    double now = monotonic_now();
    PyObject *state = self->state;
    if (!PyList_CheckExact(state) || PyList_GET_SIZE(state) != 3) {
        PyErr_SetString(PyExc_RuntimeError, "ASGIRequest: the request's state was changed");
        return -1;
    }
    PyObject *answered = PyList_GET_ITEM(state, 2);
    int sent = PyObject_IsTrue(answered);
    if (sent < 0) {
        return -1;
    }
    if (failed && !sent) {
        PyList_SetItem(state, 1, Py_NewRef(zero));
    }
    double until = sent ? PyFloat_AsDouble(answered) : now;
    if (until == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *route = PyList_GET_ITEM(state, 0);
    int named = PyObject_IsTrue(route);
    PyObject *path = scope_get(self->scope, str_path);
    int given = path != NULL ? PyObject_IsTrue(path) : 0;
    if (named < 0 || given < 0 || (path == NULL && PyErr_Occurred())) {
        Py_XDECREF(path);
        return -1;
    }
    PyObject *finished = finished_new(named ? route : unmatched, self->started,
                                      until - self->started, self->header, self->wall, 1,
                                      PyList_GET_ITEM(state, 1), given ? path : str_slash);
    Py_XDECREF(path);
    if (finished == NULL) {
        return -1;
    }
    int handed = recorder_hand_over(recorder, finished, max_pending);
    Py_DECREF(finished);
    return handed;
}

/* The app's coroutine returned (``failed`` 0) or raised: the request ends, whatever the
 * exception in flight, which is kept (an error of the recorder's is not the app's: printed
 * as unraisable, as the host must not fail by the sampler). */
static void app_ended(ASGIRequest *self, int failed)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (request_end(self, failed) < 0) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    PyErr_Restore(type, value, traceback);
}

static PySendResult ASGIRequest_am_send(ASGIRequest *self, PyObject *arg, PyObject **result)
{
    self->begun = 1;
    PySendResult sent = PyIter_Send(self->inner, arg, result);
    if (sent != PYGEN_NEXT) {
        app_ended(self, sent == PYGEN_ERROR);
    }
    return sent;
}

static PyObject *ASGIRequest_send(ASGIRequest *self, PyObject *arg)
{
    PyObject *result;
    PySendResult sent = ASGIRequest_am_send(self, arg, &result);
    if (sent == PYGEN_NEXT) {
        return result;
    }
    return sent == PYGEN_RETURN ? asgi_returned(result, 1) : NULL;
}

static PyObject *ASGIRequest_next(ASGIRequest *self)
{
    PyObject *result;
    PySendResult sent = ASGIRequest_am_send(self, Py_None, &result);
    if (sent == PYGEN_NEXT) {
        return result;
    }
    return sent == PYGEN_RETURN ? asgi_returned(result, 0) : NULL;
}

/* throw(...) passed to the app's coroutine (a cancellation): the request ends if the
 * coroutine ends by it. One never begun is not a request yet, as for a coroutine. */
static PyObject *ASGIRequest_throw(ASGIRequest *self, PyObject *args)
{
    PyObject *throw = NULL, *result = NULL;
    if (_PyObject_LookupAttr(self->inner, str_throw_name, &throw) > 0) {
        result = PyObject_Call(throw, args, NULL);
        Py_DECREF(throw);
    } else if (!PyErr_Occurred()) {
        asgi_raise_thrown(args); /* an iterator without throw: raised here, as await does */
    }
    if (result == NULL && self->begun) {
        app_ended(self, !PyErr_ExceptionMatches(PyExc_StopIteration));
    }
    return result;
}

/* close(): the app's coroutine closed; begun and not ended, the request failed. */
static PyObject *ASGIRequest_close(ASGIRequest *self, PyObject *unused)
{
    (void)unused;
    PyObject *close = NULL, *closed = Py_None;
    if (!self->ended && _PyObject_LookupAttr(self->inner, str_close, &close) < 0) {
        closed = NULL;
    } else if (close != NULL) {
        closed = PyObject_CallNoArgs(close);
        Py_DECREF(close);
    } else {
        Py_INCREF(closed);
    }
    if (self->begun) {
        app_ended(self, 1);
    }
    return closed;
}

/* Dropped unfinished (its task gone without a close): closed, as a coroutine is. */
static void ASGIRequest_finalize(ASGIRequest *self)
{
    if (!self->begun || self->ended || self->inner == NULL) {
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *closed = ASGIRequest_close(self, NULL);
    if (closed == NULL) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    Py_XDECREF(closed);
    PyErr_Restore(type, value, traceback);
}

static PyObject *ASGIRequest_await(ASGIRequest *self)
{
    return Py_NewRef(self);
}

static int ASGIRequest_traverse(ASGIRequest *self, visitproc visit, void *arg)
{
    Py_VISIT(self->inner);
    Py_VISIT(self->scope);
    Py_VISIT(self->state);
    return 0;
}

static int ASGIRequest_clear(ASGIRequest *self)
{
    Py_CLEAR(self->inner);
    Py_CLEAR(self->scope);
    Py_CLEAR(self->state);
    return 0;
}

static void ASGIRequest_dealloc(ASGIRequest *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    ASGIRequest_clear(self);
    Py_CLEAR(self->header);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ASGIRequest_methods[] = {
    {"send", (PyCFunction)ASGIRequest_send, METH_O, "send(value): the app's coroutine's send."},
    {"throw", (PyCFunction)ASGIRequest_throw, METH_VARARGS, "throw(...): the app's throw."},
    {"close", (PyCFunction)ASGIRequest_close, METH_NOARGS, "close(): the app's close."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods ASGIRequest_async = {
    .am_await = (unaryfunc)ASGIRequest_await,
    .am_send = (sendfunc)ASGIRequest_am_send,
};

static PyObject *ASGIRequest_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);

static PyTypeObject ASGIRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.ASGIRequest",
    .tp_basicsize = sizeof(ASGIRequest),
    .tp_dealloc = (destructor)ASGIRequest_dealloc,
    .tp_as_async = &ASGIRequest_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ASGIRequest(app, scope, receive, send): an HTTP request through a routed ASGI "
              "app, awaited as the app's coroutine; recorded when it ends (asgi_bind first).",
    .tp_traverse = (traverseproc)ASGIRequest_traverse,
    .tp_clear = (inquiry)ASGIRequest_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ASGIRequest_next,
    .tp_methods = ASGIRequest_methods,
    .tp_new = ASGIRequest_new,
    .tp_finalize = (destructor)ASGIRequest_finalize,
};

/* The awaitable's iterator of what the app gave: a coroutine or generator itself, else what
 * its __await__ gives. */
static PyObject *awaited_iterator(PyObject *awaitable)
{
    if (PyCoro_CheckExact(awaitable) || PyGen_CheckExact(awaitable)) {
        return Py_NewRef(awaitable);
    }
    PyAsyncMethods *async = Py_TYPE(awaitable)->tp_as_async;
    if (async == NULL || async->am_await == NULL) {
        PyErr_Format(PyExc_TypeError, "the ASGI app gave %.100s, which cannot be awaited",
                     Py_TYPE(awaitable)->tp_name);
        return NULL;
    }
    return async->am_await(awaitable);
}

static PyObject *ASGIRequest_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *app, *scope, *receive, *send;
    if (recorder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ASGIRequest: asgi_bind() first");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "ASGIRequest", 4, 4, &app, &scope, &receive, &send) ||
        (kwargs != NULL && !_PyArg_NoKeywords("ASGIRequest", kwargs))) {
        return NULL;
    }
    ASGIRequest *self = (ASGIRequest *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->started = monotonic_now();
    self->scope = Py_NewRef(scope);
    self->header = Py_NewRef(Py_None);
    PyObject *headers = scope_get(scope, str_headers);
    int any = headers != NULL ? PyObject_IsTrue(headers) : 0;
    PyObject *header = any > 0 ? native_asgi_request_start(NULL, headers) : NULL;
    Py_XDECREF(headers);
    if (header != NULL) {
        Py_SETREF(self->header, header);
        int given = PyObject_IsTrue(header);
        self->wall = given > 0 ? realtime_now() : 0.0;
    }
    if (PyErr_Occurred() || (self->state = PyList_New(3)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyList_SET_ITEM(self->state, 0, Py_NewRef(Py_None));
    PyList_SET_ITEM(self->state, 1, Py_NewRef(zero));
    PyList_SET_ITEM(self->state, 2, PyFloat_FromDouble(0.0));
    PyObject *status_send = NULL, *awaitable = NULL;
    if (PyList_GET_ITEM(self->state, 2) == NULL ||
        PyObject_SetItem(scope, state_key, self->state) < 0 ||
        (status_send = asgi_status_send(send, self->state)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *call[3] = {scope, receive, status_send};
    awaitable = PyObject_Vectorcall(app, call, 3, NULL);
    Py_DECREF(status_send);
    self->inner = awaitable != NULL ? awaited_iterator(awaitable) : NULL;
    Py_XDECREF(awaitable);
    if (self->inner == NULL) {
        /* The app failed before its first step: a failed request, as the Python path's. */
        app_ended(self, 1);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* asgi_bind(recorder, unmatched, key, max_pending): what ASGIRequest records to. */
PyObject *native_asgi_bind(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *bound_recorder, *bound_unmatched, *key;
    Py_ssize_t bound;
    if (!PyArg_ParseTuple(args, "OUUn:asgi_bind", &bound_recorder, &bound_unmatched, &key,
                          &bound)) {
        return NULL;
    }
    Py_XSETREF(recorder, Py_NewRef(bound_recorder));
    Py_XSETREF(unmatched, Py_NewRef(bound_unmatched));
    Py_XSETREF(state_key, Py_NewRef(key));
    max_pending = bound;
    Py_RETURN_NONE;
}

int asgi_request_add_type(PyObject *module)
{
    if ((str_headers = PyUnicode_InternFromString("headers")) == NULL ||
        (str_path = PyUnicode_InternFromString("path")) == NULL ||
        (str_throw_name = PyUnicode_InternFromString("throw")) == NULL ||
        (str_get_name = PyUnicode_InternFromString("get")) == NULL ||
        PyType_Ready(&ASGIRequestType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "ASGIRequest", (PyObject *)&ASGIRequestType);
}
