/* A WSGI request and the request recorder (sampler/_requests.py): the route it counts under,
 * and its end, handed over as the same tuple the Python path builds. Everything below runs
 * under the GIL.
 */
#include "middleware.h"

/* The route a template (or, with ``raw``, a path) counts under: recorder.route_name's. */
PyObject *route_name(PyObject *recorder, PyObject *seen, int raw)
{
    PyObject *names = PyObject_GetAttr(recorder, str_names);
    if (names == NULL) {
        return NULL;
    }
    PyObject *name = PyDict_Check(names) ? PyDict_GetItemWithError(names, seen) : NULL;
    Py_XINCREF(name);
    Py_DECREF(names);
    if (name != NULL) {
        return name;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyObject_CallMethodObjArgs(recorder, str_route_name, seen, raw ? Py_True : Py_False,
                                      NULL);
}

/* The Finished tuple of sampler/_requests.py, on the thread that calls. */
PyObject *finished_new(PyObject *route, double started, double duration, PyObject *header,
                       double wall, int asgi, PyObject *status, PyObject *path)
{
    PyObject *finished = PyTuple_New(9);
    PyObject *items[9] = {
        Py_NewRef(route),
        PyFloat_FromDouble(started),
        PyFloat_FromDouble(duration),
        Py_NewRef(header),
        PyFloat_FromDouble(wall),
        PyLong_FromUnsignedLong(PyThread_get_thread_ident()),
        Py_NewRef(asgi ? Py_True : Py_False),
        Py_NewRef(status),
        Py_NewRef(path),
    };
    int built = finished != NULL;
    for (int i = 0; i < 9; i++) {
        built = built && items[i] != NULL;
    }
    if (!built) {
        for (int i = 0; i < 9; i++) {
            Py_XDECREF(items[i]);
        }
        Py_XDECREF(finished);
        return NULL;
    }
    for (int i = 0; i < 9; i++) {
        PyTuple_SET_ITEM(finished, i, items[i]);
    }
    return finished;
}

/* Hands a Finished tuple to the recorder, as its finish() does: appended to its queue, the
 * recorder's thread woken if it sleeps. */
int recorder_hand_over(PyObject *recorder, PyObject *finished, Py_ssize_t max_pending)
{
    PyObject *pending = PyObject_GetAttr(recorder, str_pending);
    if (pending == NULL) {
        return -1;
    }
    Py_ssize_t length = PyObject_Size(pending);
    PyObject *done = NULL;
    if (length > 0 && length < max_pending) {
        /* A request ahead in the queue went through finish, which woke the recorder's thread
         * if it slept, and that thread leaves only with the queue empty: appended here, as
         * finish would (reading its _awake flag cost as much again). */
        done = PyObject_CallMethodOneArg(pending, str_append, finished);
    } else if (length >= 0) {
        /* The first request of a batch, or the queue full (finish counts the drop). */
        done = PyObject_CallMethodOneArg(recorder, str_finish, finished);
    }
    Py_DECREF(pending);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* 1 when the calling code runs on a greenlet other than its thread's main one (gevent's or
 * eventlet's hub switches between such: requests take turns on one OS thread, patched
 * threading or not), else 0; never fails (a look that fails says 0). As _requests.py's
 * on_greenlet(). */
int on_greenlet(void)
{
    /* greenlet.getcurrent, kept once greenlet is loaded: PyImport_GetModule cost ~1,000
     * instructions a request (it asks the module whether it is initialised), and the name
     * made anew each time ~850, so until then sys.modules is looked in directly. */
    static PyObject *getcurrent, *parent, *name;
    if (getcurrent == NULL) {
        if (name == NULL && (name = PyUnicode_InternFromString("greenlet")) == NULL) {
            PyErr_Clear();
            return 0;
        }
        PyObject *modules = PyImport_GetModuleDict();
        PyObject *module = PyDict_Check(modules) ? PyDict_GetItemWithError(modules, name) : NULL;
        if (module == NULL || module == Py_None) { /* not loaded, or the look-up failed */
            PyErr_Clear();
            return 0;
        }
        Py_INCREF(module);
        getcurrent = PyObject_GetAttrString(module, "getcurrent");
        Py_DECREF(module);
        if (parent == NULL) {
            parent = PyUnicode_InternFromString("parent");
        }
        if (getcurrent == NULL || parent == NULL) {
            Py_CLEAR(getcurrent);
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *current = PyObject_CallNoArgs(getcurrent);
    PyObject *above = current != NULL ? PyObject_GetAttr(current, parent) : NULL;
    Py_XDECREF(current);
    int green = above != NULL && above != Py_None;
    Py_XDECREF(above);
    PyErr_Clear();
    return green;
}

/* Hands the finished request to the recorder, as WSGI's _Request.finish does. */
int request_finish(WSGIRequest *request)
{
    if (request->finished) {
        return 0;
    }
    request->finished = 1;
    double now = monotonic_now();
    PyObject *route = request->route != NULL ? request->route : request->wrapper->unmatched;
    PyObject *path = environ_get(request->environ, str_path_info);
    if (path == NULL && PyErr_Occurred()) {
        return -1;
    }
    int given = path != NULL ? PyObject_IsTrue(path) : 0;
    if (given < 0) {
        return -1;
    }
    if (!given) {
        path = str_slash;
    }
    PyObject *finished = finished_new(route, request->started, now - request->started,
                                      request->header, request->wall, request->green,
                                      request->status, path);
    if (finished == NULL) {
        return -1;
    }
    WSGIWrapper *wrapper = request->wrapper;
    if (wrapper->routed && request->route == NULL && !wrapper->unrouted_told) {
        /* Routing never told us (an app whose request class was replaced after wrapping):
         * the wrapper's Python side says so and routes by a hook from now on. */
        wrapper->unrouted_told = 1;
        PyObject *told = PyObject_CallMethodNoArgs((PyObject *)wrapper, str_unrouted);
        if (told == NULL) {
            PyErr_WriteUnraisable((PyObject *)wrapper);
        }
        Py_XDECREF(told);
    }
    int failed = recorder_hand_over(wrapper->recorder, finished, wrapper->max_pending);
    Py_DECREF(finished);
    /* The environ holds the request (for the routing hook), and the body may hold the environ:
     * let go of both, so the cycle's objects are freed now, not by the next collection. */
    Py_CLEAR(request->environ);
    Py_CLEAR(request->body);
    Py_CLEAR(request->iterator);
    return failed ? -1 : 0;
}
