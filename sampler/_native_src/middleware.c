/* The request middleware's per-request work, in C: a route's tag and the WSGI wrapper.
 *
 * sampler/middleware/_wsgi.py and sampler/_labels.py hold the same logic in Python, the
 * fallback where this extension is not built, and say what each step is for. Here a request
 * costs no Python frame of ours: the wrapper is a type whose call does the work, the request
 * object is the start_response the app is given and the body the server iterates, and the
 * finished request is appended to the recorder's queue as the same tuple the Python path
 * builds. Everything below runs under the GIL.
 */
#include "native.h"

#include <structmember.h>
#include <time.h>

/* sampler._labels' state, bound once by labels_bind(). */
static PyObject *current_labels; /* the ContextVar of the labels in force */
static PyObject *frame_tags;     /* id(frame) -> label set id */
static PyObject *route_sets;     /* (labels in force, route) -> (merged labels, set id) */
static PyObject *route_set_new;  /* route_set_new(outer, route) -> that pair, on a miss */

/* Whether open tags go to the native table too: while the engine runs (tags_load on, until
 * tags_clear), as sampler._labels' _native_set. */
static int tags_kept;

void middleware_tags_kept(int kept)
{
    tags_kept = kept;
}

static double monotonic_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

/* -- RouteTag ----------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *frame_key; /* id(frame): an int */
    PyObject *outer;     /* the labels in force when made */
    PyObject *previous;  /* frame_tags' value for the frame before this tag opened, or NULL */
    int open;
} RouteTag;

static PyTypeObject RouteTagType;

static int bound(void)
{
    if (current_labels == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sampler._native: labels_bind() was not called");
        return 0;
    }
    return 1;
}

/* Readies ``tag`` for the frame at ``frame`` (not opened yet). */
static int tag_ready(RouteTag *tag, const void *frame)
{
    tag->frame_key = PyLong_FromVoidPtr((void *)frame);
    if (tag->frame_key == NULL || PyContextVar_Get(current_labels, NULL, &tag->outer) < 0) {
        return -1;
    }
    tag->previous = NULL;
    tag->open = 0;
    return 0;
}

static int native_table_set(PyObject *frame_key, PyObject *set)
{
    if (!tags_kept) {
        return 0;
    }
    void *frame = PyLong_AsVoidPtr(frame_key);
    long value = set != NULL ? PyLong_AsLong(set) : -1;
    if (PyErr_Occurred()) {
        return -1;
    }
    tags_set(frame, value);
    return 0;
}

/* Labels the frame's samples ``route`` (merged with the labels in force) from now on; returns
 * a new reference to the label set id. */
static PyObject *tag_route(RouteTag *tag, PyObject *route)
{
    PyObject *key = PyTuple_Pack(2, tag->outer, route);
    if (key == NULL) {
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(route_sets, key);
    Py_DECREF(key);
    if (found != NULL) {
        Py_INCREF(found);
    } else if (PyErr_Occurred()) {
        return NULL;
    } else {
        found = PyObject_CallFunctionObjArgs(route_set_new, tag->outer, route, NULL);
        if (found == NULL) {
            return NULL;
        }
    }
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2) {
        Py_DECREF(found);
        PyErr_SetString(PyExc_TypeError, "a route's label set must be (labels, set id)");
        return NULL;
    }
    PyObject *items = PyTuple_GET_ITEM(found, 0), *set = PyTuple_GET_ITEM(found, 1);
    if (!tag->open) {
        PyObject *previous = PyDict_GetItemWithError(frame_tags, tag->frame_key);
        if (previous == NULL && PyErr_Occurred()) {
            Py_DECREF(found);
            return NULL;
        }
        Py_XINCREF(previous);
        tag->previous = previous;
        tag->open = 1;
    }
    if (PyDict_SetItem(frame_tags, tag->frame_key, set) < 0 ||
        native_table_set(tag->frame_key, set) < 0) {
        Py_DECREF(found);
        return NULL;
    }
    PyObject *token = PyContextVar_Set(current_labels, items);
    if (token == NULL) {
        Py_DECREF(found);
        return NULL;
    }
    Py_DECREF(token);
    Py_INCREF(set);
    Py_DECREF(found);
    return set;
}

/* Closes the tag: the frame's label set and the labels in force are what they were. */
static int tag_close(RouteTag *tag)
{
    if (!tag->open) {
        return 0;
    }
    tag->open = 0;
    PyObject *previous = tag->previous;
    tag->previous = NULL;
    int failed;
    if (previous == NULL) {
        failed = PyDict_DelItem(frame_tags, tag->frame_key) < 0;
        if (failed && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            failed = 0;
        }
    } else {
        failed = PyDict_SetItem(frame_tags, tag->frame_key, previous) < 0;
    }
    failed = failed || native_table_set(tag->frame_key, previous) < 0;
    Py_XDECREF(previous);
    if (failed) {
        return -1;
    }
    PyObject *token = PyContextVar_Set(current_labels, tag->outer);
    if (token == NULL) {
        return -1;
    }
    Py_DECREF(token);
    return 0;
}

static void tag_forget(RouteTag *tag)
{
    Py_CLEAR(tag->frame_key);
    Py_CLEAR(tag->outer);
    Py_CLEAR(tag->previous);
}

static PyObject *RouteTag_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *frame;
    if (!bound() || !PyArg_UnpackTuple(args, "RouteTag", 1, 1, &frame) ||
        (kwargs != NULL && !_PyArg_NoKeywords("RouteTag", kwargs))) {
        return NULL;
    }
    RouteTag *tag = (RouteTag *)type->tp_alloc(type, 0);
    if (tag != NULL && tag_ready(tag, frame) < 0) {
        Py_DECREF(tag);
        return NULL;
    }
    return (PyObject *)tag;
}

static void RouteTag_dealloc(RouteTag *tag)
{
    tag_forget(tag);
    Py_TYPE(tag)->tp_free((PyObject *)tag);
}

static PyObject *RouteTag_route(RouteTag *tag, PyObject *route)
{
    return tag_route(tag, route);
}

static PyObject *RouteTag_close(RouteTag *tag, PyObject *unused)
{
    (void)unused;
    if (tag_close(tag) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef RouteTag_methods[] = {
    {"route", (PyCFunction)RouteTag_route, METH_O,
     "Labels the frame's samples route=ROUTE from now on; returns the label set id."},
    {"close", (PyCFunction)RouteTag_close, METH_NOARGS,
     "Closes the tag: the labels in force are those from before it opened."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RouteTagType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RouteTag",
    .tp_basicsize = sizeof(RouteTag),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RouteTag(frame): a request's tag, one label (route) on the frame once routed.",
    .tp_new = RouteTag_new,
    .tp_dealloc = (destructor)RouteTag_dealloc,
    .tp_methods = RouteTag_methods,
};

/* -- the WSGI wrapper ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *app;
    PyObject *recorder;      /* sampler._requests.recorder */
    PyObject *fallback;      /* the pure-Python __call__, for a call with no Python caller */
    PyObject *unmatched;     /* the route of a routed app's request until routed */
    PyObject *file_wrapper;  /* "wsgi.file_wrapper" */
    PyObject *dict;
    Py_ssize_t max_pending;  /* the recorder's queue bound: past it recorder.finish drops */
    int routed;              /* routing happens in the app: a hook calls request.routed() */
    int unrouted_told;       /* a request ended unrouted in a routed app: told once */
} WSGIWrapper;

typedef struct {
    PyObject_HEAD
    WSGIWrapper *wrapper;
    PyObject *environ;
    PyObject *start_response;
    PyObject *body;
    PyObject *header; /* the request-start header, or None */
    PyObject *status; /* what the app passed to start_response; 0 until then or if it raised */
    PyObject *route;  /* once routed (or from the path), else NULL */
    double started, wall;
    vectorcallfunc vectorcall; /* request_vectorcall */
    RouteTag tag;     /* embedded: its PyObject_HEAD unused */
    int finished;
} WSGIRequest;

static PyTypeObject WSGIWrapperType, WSGIRequestType;
static PyObject *request_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames);

static PyObject *str_pending, *str_awake, *str_finish, *str_route_name, *str_close;
static PyObject *str_path_info, *str_request_start, *str_queue_start, *str_file_wrapper;
static PyObject *str_slash, *str_append, *str_key, *zero;
static PyObject *str_environ, *str_rule, *str_route, *str_routed;
static PyObject *str_unrouted, *str_names;

static PyObject *environ_get(PyObject *environ, PyObject *key)
{
    /* A borrowed reference, or NULL (an error set only if the look-up failed). */
    return PyDict_Check(environ) ? PyDict_GetItemWithError(environ, key) : NULL;
}

/* The route a template (or, with ``raw``, a path) counts under: recorder.route_name's. */
static PyObject *route_name(PyObject *recorder, PyObject *seen, int raw)
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

/* Hands the finished request to the recorder, as WSGI's _Request.finish does: appended to
 * its queue, the recorder's thread woken if it sleeps. */
static int request_finish(WSGIRequest *request)
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
    /* The Finished tuple of sampler/_requests.py. */
    PyObject *finished = PyTuple_New(9);
    PyObject *items[9] = {
        Py_NewRef(route),
        PyFloat_FromDouble(request->started),
        PyFloat_FromDouble(now - request->started),
        Py_NewRef(request->header),
        PyFloat_FromDouble(request->wall),
        PyLong_FromUnsignedLong(PyThread_get_thread_ident()),
        Py_NewRef(Py_False),
        Py_NewRef(request->status),
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
        return -1;
    }
    for (int i = 0; i < 9; i++) {
        PyTuple_SET_ITEM(finished, i, items[i]);
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
    PyObject *recorder = wrapper->recorder;
    PyObject *pending = PyObject_GetAttr(recorder, str_pending);
    int failed = pending == NULL;
    if (!failed) {
        /* The queue's bound and the wake-up: recorder.finish does both, called when the queue
         * is long (it counts the drop) or the recorder's thread is not awake. */
        PyObject *awake = PyObject_GetAttr(recorder, str_awake);
        Py_ssize_t length = awake != NULL ? PyObject_Size(pending) : -1;
        if (awake == NULL || length < 0) {
            failed = 1;
        } else if (awake == Py_True && length < request->wrapper->max_pending) {
            PyObject *done = PyObject_CallMethodOneArg(pending, str_append, finished);
            failed = done == NULL;
            Py_XDECREF(done);
        } else {
            PyObject *done = PyObject_CallMethodOneArg(recorder, str_finish, finished);
            failed = done == NULL;
            Py_XDECREF(done);
        }
        Py_XDECREF(awake);
        Py_DECREF(pending);
    }
    Py_DECREF(finished);
    /* The environ holds the request (for the routing hook), and the body may hold the environ:
     * let go of both, so the cycle's objects are freed now, not by the next collection. */
    Py_CLEAR(request->environ);
    Py_CLEAR(request->body);
    return failed ? -1 : 0;
}

static WSGIRequest *request_new(WSGIWrapper *wrapper, PyObject *environ,
                                PyObject *start_response, const void *frame)
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
    request->route = NULL;
    request->header = NULL;
    request->status = Py_NewRef(zero);
    request->wall = 0.0;
    request->finished = 0;
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

static PyObject *request_iter(WSGIRequest *request)
{
    if (request->body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the request has no body yet");
        return NULL;
    }
    return PyObject_GetIter(request->body);
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
static PyObject *request_routed(WSGIRequest *request, PyObject *template)
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

/* -- Flask's routing, seen as it happens ------------------------------------------------------ */

/* An attribute of Flask's request class that Flask sets when it has matched the URL:
 * ``url_rule`` (a rule: the request is named after its template) or ``routing_exception``
 * (no rule: [unmatched]). Stored in the instance's dict as a plain attribute would be; setting
 * it names the request in flight, with no before_request hook for Flask to call. */
typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *unmatched;
    int is_rule;
} RoutedAttribute;

static PyTypeObject RoutedAttributeType;

static PyObject *routed_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"name", "is_rule", "unmatched", NULL};
    PyObject *name, *unmatched;
    int is_rule;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UpU:RoutedAttribute", keywords, &name,
                                     &is_rule, &unmatched)) {
        return NULL;
    }
    RoutedAttribute *attribute = (RoutedAttribute *)type->tp_alloc(type, 0);
    if (attribute != NULL) {
        attribute->name = Py_NewRef(name);
        attribute->unmatched = Py_NewRef(unmatched);
        attribute->is_rule = is_rule;
    }
    return (PyObject *)attribute;
}

static void routed_dealloc(RoutedAttribute *attribute)
{
    Py_CLEAR(attribute->name);
    Py_CLEAR(attribute->unmatched);
    Py_TYPE(attribute)->tp_free((PyObject *)attribute);
}

static PyObject *routed_get(RoutedAttribute *attribute, PyObject *instance, PyObject *type)
{
    (void)type;
    if (instance == NULL) {
        return Py_NewRef((PyObject *)attribute);
    }
    PyObject *dict = PyObject_GenericGetDict(instance, NULL);
    if (dict == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(dict, attribute->name);
    Py_XINCREF(value);
    Py_DECREF(dict);
    if (value == NULL && !PyErr_Occurred()) {
        value = Py_NewRef(Py_None); /* Flask's class default */
    }
    return value;
}

/* Names the request in flight whose environ this Flask request has; quietly nothing when
 * there is none (a test request context) or it is named already. */
static void routed_notify(RoutedAttribute *attribute, PyObject *dict, PyObject *value)
{
    PyObject *environ = PyDict_GetItemWithError(dict, str_environ);
    PyObject *request = environ != NULL ? environ_get(environ, str_key) : NULL;
    if (request == NULL) {
        PyErr_Clear();
        return;
    }
    Py_INCREF(request);
    PyObject *template = attribute->is_rule ? PyObject_GetAttr(value, str_rule)
                                            : Py_NewRef(attribute->unmatched);
    PyObject *done = NULL;
    if (template != NULL) {
        if (Py_IS_TYPE(request, &WSGIRequestType)) {
            done = ((WSGIRequest *)request)->route == NULL
                       ? request_routed((WSGIRequest *)request, template)
                       : Py_NewRef(Py_None);
        } else {
            PyObject *route = NULL;
            if (_PyObject_LookupAttr(request, str_route, &route) >= 0) {
                done = route == NULL || route == Py_None
                           ? PyObject_CallMethodOneArg(request, str_routed, template)
                           : Py_NewRef(Py_None);
            }
            Py_XDECREF(route);
        }
    }
    if (done == NULL) {
        /* Never fail the app's routing for the profiler: the request stays unmatched. */
        PyErr_WriteUnraisable((PyObject *)attribute);
    }
    Py_XDECREF(done);
    Py_XDECREF(template);
    Py_DECREF(request);
}

static int routed_set(RoutedAttribute *attribute, PyObject *instance, PyObject *value)
{
    PyObject *dict = PyObject_GenericGetDict(instance, NULL);
    if (dict == NULL) {
        return -1;
    }
    int failed;
    if (value == NULL) {
        failed = PyDict_DelItem(dict, attribute->name) < 0;
        if (failed && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            PyErr_SetObject(PyExc_AttributeError, attribute->name);
        }
    } else {
        failed = PyDict_SetItem(dict, attribute->name, value) < 0;
        if (!failed && value != Py_None) {
            routed_notify(attribute, dict, value);
        }
    }
    Py_DECREF(dict);
    return failed ? -1 : 0;
}

static PyTypeObject RoutedAttributeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RoutedAttribute",
    .tp_basicsize = sizeof(RoutedAttribute),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RoutedAttribute(name, is_rule, unmatched): a Flask request attribute that names "
              "the request in flight when Flask sets it.",
    .tp_new = routed_new,
    .tp_dealloc = (destructor)routed_dealloc,
    .tp_descr_get = (descrgetfunc)routed_get,
    .tp_descr_set = (descrsetfunc)routed_set,
};

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

static PyTypeObject WSGIRequestType = {
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
    .tp_methods = request_methods,
    .tp_getset = request_getset,
};

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
    if (caller == NULL || !PyDict_Check(environ) || !bound()) {
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

static PyTypeObject WSGIWrapperType = {
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

/* -- the module's part ------------------------------------------------------------------------- */

PyObject *native_labels_bind(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *var, *tags, *sets, *set_new;
    if (!PyArg_ParseTuple(args, "O!O!O!O:labels_bind", &PyContextVar_Type, &var, &PyDict_Type,
                          &tags, &PyDict_Type, &sets, &set_new)) {
        return NULL;
    }
    Py_XSETREF(current_labels, Py_NewRef(var));
    Py_XSETREF(frame_tags, Py_NewRef(tags));
    Py_XSETREF(route_sets, Py_NewRef(sets));
    Py_XSETREF(route_set_new, Py_NewRef(set_new));
    Py_RETURN_NONE;
}

int middleware_add_types(PyObject *module)
{
    struct {
        PyObject **at;
        const char *text;
    } names[] = {
        {&str_pending, "pending"},           {&str_awake, "_awake"},
        {&str_finish, "finish"},             {&str_route_name, "route_name"},
        {&str_close, "close"},               {&str_path_info, "PATH_INFO"},
        {&str_request_start, "HTTP_X_REQUEST_START"},
        {&str_queue_start, "HTTP_X_QUEUE_START"},
        {&str_file_wrapper, "wsgi.file_wrapper"},
        {&str_slash, "/"},                   {&str_append, "append"},
        {&str_key, "fleetflame.request"},
        {&str_environ, "environ"},           {&str_rule, "rule"},
        {&str_route, "route"},               {&str_routed, "routed"},
        {&str_unrouted, "_unrouted"},        {&str_names, "names"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].at = PyUnicode_InternFromString(names[i].text);
        if (*names[i].at == NULL) {
            return -1;
        }
    }
    zero = PyLong_FromLong(0);
    if (zero == NULL || PyType_Ready(&RouteTagType) < 0 || PyType_Ready(&WSGIRequestType) < 0 ||
        PyType_Ready(&WSGIWrapperType) < 0 || PyType_Ready(&RoutedAttributeType) < 0 ||
        PyModule_AddObjectRef(module, "RoutedAttribute", (PyObject *)&RoutedAttributeType) < 0 ||
        PyModule_AddObjectRef(module, "RouteTag", (PyObject *)&RouteTagType) < 0 ||
        PyModule_AddObjectRef(module, "WSGIWrapper", (PyObject *)&WSGIWrapperType) < 0) {
        return -1;
    }
    return 0;
}
