/* WSGIWrapper: the WSGI middleware's type (sampler.middleware.WSGIMiddleware is one), whose
 * call does a request's work: it makes the request (wsgi_request.c), tags the caller's frame
 * with its route (route_tag.c), calls the app and gives the server the request as its body.
 * Everything below runs under the GIL.
 */
#include "middleware.h"

#include <structmember.h>

/* Gives up a request before the app ran, the error set kept: its tag closed, if it opened. */
static PyObject *request_abandon(WSGIRequest *request)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (tag_close(&request->tag) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(type, value, traceback);
    Py_DECREF(request);
    return NULL;
}

/* The wrapper's call: the Python WSGIMiddleware.__call__, step for step. */
static PyObject *wrapper_call(WSGIWrapper *wrapper, PyObject *args, PyObject *kwargs)
{
    PyObject *environ, *start_response;
    if (!PyArg_UnpackTuple(args, "WSGIMiddleware", 2, 2, &environ, &start_response) ||
        (kwargs != NULL && !_PyArg_NoKeywords("WSGIMiddleware", kwargs))) {
        return NULL;
    }
    if (wrapper->app == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the middleware was not initialised (__init__)");
        return NULL;
    }
    PyFrameObject *caller = PyEval_GetFrame();
    if (caller == NULL || !PyDict_Check(environ) || !labels_bound()) {
        /* Called from C with no Python frame to tag (uWSGI, mod_wsgi), or an environ that is
         * not a dict: the Python path, which tags a frame of its own. */
        PyErr_Clear();
        return PyObject_CallFunctionObjArgs(wrapper->fallback, (PyObject *)wrapper, environ,
                                            start_response, NULL);
    }
    WSGIRequest *request = request_new(wrapper, environ, start_response, caller);
    if (request == NULL) {
        return NULL;
    }
    if (!wrapper->routed) {
        PyObject *path = environ_get(environ, str_path_info);
        int given = path != NULL ? PyObject_IsTrue(path) : 0;
        if (given < 0 || PyErr_Occurred()) {
            return request_abandon(request);
        }
        request->route = route_name(wrapper->recorder, given ? path : str_slash, 1);
        PyObject *set = request->route != NULL ? tag_route(&request->tag, request->route) : NULL;
        if (set == NULL) {
            return request_abandon(request);
        }
        Py_DECREF(set);
    }
    if (PyDict_SetItem(environ, str_key, (PyObject *)request) < 0) {
        return request_abandon(request);
    }
    PyObject *body = PyObject_CallFunctionObjArgs(wrapper->app, environ, (PyObject *)request,
                                                  NULL);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (body == NULL) {
        Py_INCREF(zero);
        Py_SETREF(request->status, zero);
        if (request_finish(request) < 0) {
            PyErr_Clear(); /* the app's exception is the one raised */
        }
    }
    int close_failed = tag_close(&request->tag) < 0;
    Py_CLEAR(request->tag.frame_key); /* closed for good: a late routed() names, tags nothing */
    if (body == NULL || close_failed) {
        if (body == NULL) {
            if (close_failed || PyErr_Occurred()) {
                PyErr_Clear();
            }
            PyErr_Restore(type, value, traceback);
        }
        Py_XDECREF(body);
        Py_DECREF(request);
        return NULL;
    }
    PyObject *file_wrapper = environ_get(environ, str_file_wrapper);
    if (file_wrapper != NULL && PyType_Check(file_wrapper) &&
        PyObject_TypeCheck(body, (PyTypeObject *)file_wrapper)) {
        /* Left as is, so the server can still send the file its own way (sendfile). */
        int failed = request_finish(request) < 0;
        Py_DECREF(request);
        if (failed) {
            Py_DECREF(body);
            return NULL;
        }
        return body;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(body);
        Py_DECREF(request);
        return NULL;
    }
    request->body = body;
    return (PyObject *)request;
}

static int wrapper_init(WSGIWrapper *wrapper, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"app",       "routed",      "recorder", "fallback",
                               "unmatched", "max_pending", NULL};
    PyObject *app, *recorder, *fallback, *unmatched;
    int routed;
    Py_ssize_t bound;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OpOOUn:WSGIWrapper", keywords, &app, &routed,
                                     &recorder, &fallback, &unmatched, &bound)) {
        return -1;
    }
    Py_XSETREF(wrapper->app, Py_NewRef(app));
    Py_XSETREF(wrapper->recorder, Py_NewRef(recorder));
    Py_XSETREF(wrapper->fallback, Py_NewRef(fallback));
    Py_XSETREF(wrapper->unmatched, Py_NewRef(unmatched));
    wrapper->routed = routed;
    wrapper->max_pending = bound;
    return 0;
}

static int wrapper_traverse(WSGIWrapper *wrapper, visitproc visit, void *arg)
{
    Py_VISIT(wrapper->app);
    Py_VISIT(wrapper->recorder);
    Py_VISIT(wrapper->fallback);
    Py_VISIT(wrapper->unmatched);
    Py_VISIT(wrapper->dict);
    return 0;
}

static int wrapper_clear(WSGIWrapper *wrapper)
{
    Py_CLEAR(wrapper->app);
    Py_CLEAR(wrapper->recorder);
    Py_CLEAR(wrapper->fallback);
    Py_CLEAR(wrapper->unmatched);
    Py_CLEAR(wrapper->dict);
    return 0;
}

static void wrapper_dealloc(WSGIWrapper *wrapper)
{
    PyObject_GC_UnTrack(wrapper);
    wrapper_clear(wrapper);
    Py_TYPE(wrapper)->tp_free((PyObject *)wrapper);
}

static PyMemberDef wrapper_members[] = {
    {"app", T_OBJECT, offsetof(WSGIWrapper, app), READONLY, "The wrapped app."},
    {"_routed", T_BOOL, offsetof(WSGIWrapper, routed), READONLY,
     "Whether a routing hook names the requests."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject WSGIWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.WSGIWrapper",
    .tp_basicsize = sizeof(WSGIWrapper),
    .tp_dictoffset = offsetof(WSGIWrapper, dict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "WSGIWrapper(app, routed, recorder, fallback, unmatched, max_pending): the WSGI middleware's "
              "per-request work in C (sampler.middleware.WSGIMiddleware is one).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wrapper_init,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_call = (ternaryfunc)wrapper_call,
    .tp_members = wrapper_members,
};
