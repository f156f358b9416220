/* The WSGI middleware's request in flight (wsgi_wrapper.c makes it): the start_response the app
 * is given, which notes the status, and the body the server iterates, whose close ends the
 * request (wsgi_recorder.c hands it over). WSGI's _Request in sampler/middleware/_wsgi.py
 * holds the same in Python. Everything below runs under the GIL.
 */
#include "middleware.h"

#include <stddef.h>
#include <time.h>

static PyObject *request_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames);

WSGIRequest *request_new(WSGIWrapper *wrapper, PyObject *environ, PyObject *start_response,
                         const void *frame)
{
    WSGIRequest *request = PyObject_GC_New(WSGIRequest, &WSGIRequestType);
    if (request == NULL) {
        return NULL;
    }
    request->started = monotonic_now();
    request->vectorcall = request_vectorcall;
    request->wrapper = (WSGIWrapper *)Py_NewRef((PyObject *)wrapper);
    request->environ = Py_NewRef(environ);
    request->start_response = Py_NewRef(start_response);
    request->body = NULL;
    request->iterator = NULL;
    request->route = NULL;
    request->header = NULL;
    request->status = Py_NewRef(zero);
    request->wall = 0.0;
    request->finished = 0;
    request->green = on_greenlet();
    request->tag.frame_key = request->tag.outer = request->tag.previous = NULL;
    request->tag.open = 0;
    PyObject_GC_Track(request); /* every field set: the collector may look from here on */
    /* As the Python path: the first header that is there and not empty, else the second. */
    PyObject *header = environ_get(environ, str_request_start);
    int given = header != NULL ? PyObject_IsTrue(header) : 0;
    if (given == 0 && !PyErr_Occurred()) {
        header = environ_get(environ, str_queue_start);
        given = header != NULL ? PyObject_IsTrue(header) : 0;
    }
    if (given < 0 || PyErr_Occurred()) {
        Py_DECREF(request);
        return NULL;
    }
    request->header = Py_NewRef(header != NULL ? header : Py_None);
    if (given) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        request->wall = (double)now.tv_sec + now.tv_nsec * 1e-9;
    }
    if (tag_ready(&request->tag, frame) < 0) {
        Py_DECREF(request);
        return NULL;
    }
    return request;
}

static int request_traverse(WSGIRequest *request, visitproc visit, void *arg)
{
    Py_VISIT(request->wrapper);
    Py_VISIT(request->environ);
    Py_VISIT(request->start_response);
    Py_VISIT(request->body);
    Py_VISIT(request->iterator);
    Py_VISIT(request->header);
    Py_VISIT(request->status);
    Py_VISIT(request->route);
    Py_VISIT(request->tag.outer);
    Py_VISIT(request->tag.previous);
    return 0;
}

static int request_clear(WSGIRequest *request)
{
    request->finished = 1; /* nothing left to hand over */
    Py_CLEAR(request->wrapper);
    Py_CLEAR(request->environ);
    Py_CLEAR(request->start_response);
    Py_CLEAR(request->body);
    Py_CLEAR(request->iterator);
    Py_CLEAR(request->header);
    Py_CLEAR(request->status);
    Py_CLEAR(request->route);
    tag_forget(&request->tag);
    return 0;
}

static void request_dealloc(WSGIRequest *request)
{
    PyObject_GC_UnTrack(request);
    request_clear(request);
    PyObject_GC_Del(request);
}

/* The start_response the app is given: notes the status, then calls the server's. */
static PyObject *request_call(WSGIRequest *request, PyObject *args, PyObject *kwargs)
{
    PyObject *status, *headers, *exc_info = Py_None;
    static char *keywords[] = {"status", "headers", "exc_info", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:start_response", keywords, &status,
                                     &headers, &exc_info)) {
        return NULL;
    }
    if (request->start_response == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the request is over");
        return NULL;
    }
    Py_XSETREF(request->status, Py_NewRef(status));
    return PyObject_CallFunctionObjArgs(request->start_response, status, headers, exc_info, NULL);
}

/* The same, called the usual way (two or three arguments by position): no tuple built. */
static PyObject *request_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames)
{
    Py_ssize_t count = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || count < 2 || count > 3) {
        return _PyObject_MakeTpCall(PyThreadState_Get(), self, args, count, kwnames);
    }
    WSGIRequest *request = (WSGIRequest *)self;
    if (request->start_response == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the request is over");
        return NULL;
    }
    Py_XSETREF(request->status, Py_NewRef(args[0]));
    PyObject *passed[3] = {args[0], args[1], count == 3 ? args[2] : Py_None};
    return PyObject_Vectorcall(request->start_response, passed, 3, NULL);
}

/* The server iterates the request, which iterates the body: an answer that breaks off (the
 * body raises) is a failed request, as one whose app raised. */
static PyObject *request_iter(WSGIRequest *request)
{
    if (request->body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the request has no body yet");
        return NULL;
    }
    if (request->iterator == NULL) {
        request->iterator = PyObject_GetIter(request->body);
        if (request->iterator == NULL) {
            return NULL;
        }
    }
    return Py_NewRef((PyObject *)request);
}

static PyObject *request_next(WSGIRequest *request)
{
    if (request->iterator == NULL) {
        return NULL; /* over: handed over, or never iterated */
    }
    /* A streamed body's work is the request's: while it makes a chunk, the frame asking for
     * it (the server's) is tagged with the route, as the app's call was. Under greenlets a
     * slow request's stacks are its route's samples (sampler/_requests.py): untagged, a
     * streamed answer had none. */
    RouteTag tag = {.frame_key = NULL, .outer = NULL, .previous = NULL, .open = 0};
    PyFrameObject *caller = request->green && request->route != NULL ? PyEval_GetFrame() : NULL;
    if (caller != NULL) {
        PyObject *set = tag_ready(&tag, caller) < 0 ? NULL : tag_route(&tag, request->route);
        if (set == NULL) {
            tag_forget(&tag);
            return NULL;
        }
        Py_DECREF(set);
    }
    PyObject *chunk = (*Py_TYPE(request->iterator)->tp_iternext)(request->iterator);
    if (chunk == NULL && PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_StopIteration)) {
        Py_XSETREF(request->status, Py_NewRef(zero));
    }
    if (caller != NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        int failed = tag_close(&tag) < 0;
        tag_forget(&tag);
        if (failed && chunk != NULL) {
            Py_CLEAR(chunk); /* the tag's error is raised */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        } else {
            if (failed) {
                PyErr_Clear(); /* the body's own error (or end) is the one raised */
            }
            PyErr_Restore(type, value, traceback);
        }
    }
    return chunk;
}

/* Closes the app's body, then hands the finished request over (even if closing raised). */
static PyObject *request_close(WSGIRequest *request, PyObject *unused)
{
    (void)unused;
    int failed = 0;
    if (request->body != NULL) {
        PyObject *close;
        if (_PyObject_LookupAttr(request->body, str_close, &close) < 0) {
            failed = 1;
        } else if (close != NULL) {
            PyObject *done = PyObject_CallNoArgs(close);
            failed = done == NULL;
            Py_XDECREF(done);
            Py_DECREF(close);
        }
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int finish_failed = request_finish(request) < 0;
    if (failed) {
        if (finish_failed) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (finish_failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The routing hook's call: the request is named after its route template from now on. */
PyObject *request_routed(WSGIRequest *request, PyObject *template)
{
    if (request->wrapper == NULL) {
        Py_RETURN_NONE; /* cleared by the collector: nothing to name */
    }
    PyObject *route = route_name(request->wrapper->recorder, template, 0);
    if (route == NULL) {
        return NULL;
    }
    Py_XSETREF(request->route, route);
    if (request->tag.frame_key != NULL && !request->finished) {
        PyObject *set = tag_route(&request->tag, route);
        if (set == NULL) {
            return NULL;
        }
        Py_DECREF(set);
    }
    Py_RETURN_NONE;
}

static PyObject *request_get_route(WSGIRequest *request, void *unused)
{
    (void)unused;
    return Py_NewRef(request->route != NULL ? request->route : Py_None);
}

static PyObject *request_get_status(WSGIRequest *request, void *unused)
{
    (void)unused;
    return Py_NewRef(request->status != NULL ? request->status : Py_None);
}

static PyMethodDef request_methods[] = {
    {"close", (PyCFunction)request_close, METH_NOARGS,
     "Closes the app's body; the request is timed up to here."},
    {"routed", (PyCFunction)request_routed, METH_O,
     "routed(template): names the request (and its samples) after its route from now on."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"route", (getter)request_get_route, NULL, "The route, once known; None before.", NULL},
    {"status", (getter)request_get_status, NULL, "What the app passed to start_response.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject WSGIRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.WSGIRequest",
    .tp_basicsize = sizeof(WSGIRequest),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(WSGIRequest, vectorcall),
    .tp_doc = "One request in flight: the app's start_response and the body the server gets.",
    .tp_dealloc = (destructor)request_dealloc,
    .tp_traverse = (traverseproc)request_traverse,
    .tp_clear = (inquiry)request_clear,
    .tp_call = (ternaryfunc)request_call,
    .tp_iter = (getiterfunc)request_iter,
    .tp_iternext = (iternextfunc)request_next,
    .tp_methods = request_methods,
    .tp_getset = request_getset,
};
