/* An ASGI request through a routed app (Starlette, FastAPI), as ASGIMiddleware's C path
 * (sampler/middleware/_asgi.py) runs it: what the Python path's ``_request`` coroutine does,
 * by an Awaiting (asgi.h) awaiting the app's coroutine. Made, it notes the request's start
 * and its request-start header, puts the request's state in the scope and calls the app with
 * a StatusSend; when the app's coroutine ends (returned, raised, cancelled, closed), it hands
 * the request to the recorder, as the Python path's ``finally`` does. */
#include "asgi.h"
#include "module.h"

#include <time.h>

/* Bound by asgi_bind(): the recorder, the route of requests no route named, the scope's key
 * of the state, and the recorder's queue bound. */
static PyObject *recorder, *unmatched, *state_key;
static Py_ssize_t max_pending;
static PyObject *str_headers, *str_path;

static double realtime_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

/* The request's end: its Finished tuple to the recorder. ``failed``: the app raised (or was
 * closed); before the answer was sent, the status is 0. The state's items are read as the
 * Python path reads them, each a reference of our own: the app may change the list. */
static int request_end(Awaiting *self, int failed)
{
    double now = monotonic_now();
    PyObject *state = self->state, *answered = PySequence_GetItem(state, 2);
    int sent = answered != NULL ? PyObject_IsTrue(answered) : -1;
    double until = sent > 0 ? PyFloat_AsDouble(answered) : now;
    Py_XDECREF(answered);
    if (sent < 0 || (until == -1.0 && PyErr_Occurred()) ||
        (failed && !sent && PySequence_SetItem(state, 1, zero) < 0)) {
        return -1;
    }
    PyObject *route = PySequence_GetItem(state, 0), *status = NULL, *path = NULL;
    int named = route != NULL ? PyObject_IsTrue(route) : -1;
    if (named >= 0) {
        status = PySequence_GetItem(state, 1);
        path = status != NULL ? mapping_get(self->scope, str_path) : NULL;
    }
    int given = path != NULL ? PyObject_IsTrue(path) : 0;
    PyObject *finished = NULL;
    if (named >= 0 && status != NULL && given >= 0 && !PyErr_Occurred()) {
        finished = finished_new(named ? route : unmatched, self->started, until - self->started,
                                self->header, self->wall, 1, status, given ? path : str_slash);
    }
    Py_XDECREF(route);
    Py_XDECREF(status);
    Py_XDECREF(path);
    if (finished == NULL) {
        return -1;
    }
    int handed = recorder_hand_over(recorder, finished, max_pending);
    Py_DECREF(finished);
    return handed;
}

/* The request's state, [None, 0, 0.0]. */
static PyObject *state_new(void)
{
    PyObject *state = PyList_New(3), *answered = PyFloat_FromDouble(0.0);
    if (state == NULL || answered == NULL) {
        Py_XDECREF(state);
        Py_XDECREF(answered);
        return NULL;
    }
    PyList_SET_ITEM(state, 0, Py_NewRef(Py_None));
    PyList_SET_ITEM(state, 1, Py_NewRef(zero));
    PyList_SET_ITEM(state, 2, answered);
    return state;
}

/* The request's first step, the Python path's body up to its ``await``: the start, the
 * header, the state in the scope, and the app called with a StatusSend; an app that fails
 * to give an awaitable fails the request. */
static int request_start(Awaiting *self)
{
    self->started = monotonic_now();
    PyObject *scope = self->scope, *headers = mapping_get(scope, str_headers);
    int any = headers != NULL ? PyObject_IsTrue(headers) : 0;
    PyObject *header = any > 0 ? native_asgi_request_start(NULL, headers) : NULL;
    Py_XDECREF(headers);
    self->header = header != NULL ? header : Py_NewRef(Py_None);
    self->wall = header != NULL && PyObject_IsTrue(header) > 0 ? realtime_now() : 0.0;
    PyObject *status_send = NULL;
    if (PyErr_Occurred() || (self->state = state_new()) == NULL ||
        PyObject_SetItem(scope, state_key, self->state) < 0 ||
        (status_send = asgi_status_send(self->send, self->state)) == NULL) {
        return -1;
    }
    PyObject *call[3] = {scope, self->receive, status_send};
    PyObject *awaitable = PyObject_Vectorcall(self->callee, call, 3, NULL);
    Py_DECREF(status_send);
    self->inner = awaitable != NULL ? awaited_iterator(awaitable) : NULL;
    Py_XDECREF(awaitable);
    if (self->inner == NULL) {
        awaiting_finish(self, 1);
        return -1;
    }
    return 0;
}

/* asgi_request(app, scope, receive, send): the request's awaitable; nothing runs until its
 * first step, as for a coroutine. */
PyObject *native_asgi_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (recorder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asgi_request: asgi_bind() first");
        return NULL;
    }
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "asgi_request(app, scope, receive, send)");
        return NULL;
    }
    Awaiting *self = awaiting_new(request_start, request_end);
    if (self != NULL) {
        self->callee = Py_NewRef(args[0]);
        self->scope = Py_NewRef(args[1]);
        self->receive = Py_NewRef(args[2]);
        self->send = Py_NewRef(args[3]);
    }
    return (PyObject *)self;
}

/* asgi_bind(recorder, unmatched, key, max_pending): what asgi_request records to. */
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

/* The recorder asgi_bind() bound, or NULL with a RuntimeError (for asgi_route.c). */
PyObject *asgi_recorder(void)
{
    if (recorder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asgi_bind() first");
    }
    return recorder;
}

/* The scope's key of a request's state (for asgi_route.c). */
PyObject *asgi_state_key(void)
{
    return state_key;
}

int asgi_request_ready(void)
{
    if ((str_headers = PyUnicode_InternFromString("headers")) == NULL ||
        (str_path = PyUnicode_InternFromString("path")) == NULL) {
        return -1;
    }
    return 0;
}
