/* RouteTag, the request middleware's tag (middleware.c): one label, route, on a request's
 * frame once it is routed. sampler/_labels.py holds the same in Python. A tag writes
 * sampler._labels' state (bound once by labels_bind()) and, while the engine keeps them, the
 * engine's open tags (tags.c). The WSGI wrapper's requests embed one; the ASGI and Django
 * middleware make them. Everything below runs under the GIL.
 */
#include "middleware.h"
#include "module.h"

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

int labels_bound(void)
{
    if (current_labels == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sampler._native: labels_bind() was not called");
        return 0;
    }
    return 1;
}

/* Readies ``tag`` for the frame at ``frame`` (not opened yet). */
int tag_ready(RouteTag *tag, const void *frame)
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

/* The last (labels in force, route) tagged and what route_sets gave for it: requests after
 * requests ask for the same objects, and hashing the key took ~300 instructions. A set id
 * never changes its labels, so a pair kept here stays right when route_sets is emptied. */
static PyObject *last_outer, *last_route, *last_found;

static PyObject *route_set_of(PyObject *outer, PyObject *route)
{
    if (outer == last_outer && route == last_route) {
        return Py_NewRef(last_found);
    }
    PyObject *key = PyTuple_Pack(2, outer, route);
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
        found = PyObject_CallFunctionObjArgs(route_set_new, outer, route, NULL);
        if (found == NULL) {
            return NULL;
        }
    }
    Py_XSETREF(last_outer, Py_NewRef(outer));
    Py_XSETREF(last_route, Py_NewRef(route));
    Py_XSETREF(last_found, Py_NewRef(found));
    return found;
}

/* Labels the frame's samples ``route`` (merged with the labels in force) from now on; returns
 * a new reference to the label set id. */
PyObject *tag_route(RouteTag *tag, PyObject *route)
{
    PyObject *found = route_set_of(tag->outer, route);
    if (found == NULL) {
        return NULL;
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
int tag_close(RouteTag *tag)
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

void tag_forget(RouteTag *tag)
{
    Py_CLEAR(tag->frame_key);
    Py_CLEAR(tag->outer);
    Py_CLEAR(tag->previous);
}

static PyObject *RouteTag_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *frame;
    if (!labels_bound() || !PyArg_UnpackTuple(args, "RouteTag", 1, 1, &frame) ||
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

PyTypeObject RouteTagType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RouteTag",
    .tp_basicsize = sizeof(RouteTag),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RouteTag(frame): a request's tag, one label (route) on the frame once routed.",
    .tp_new = RouteTag_new,
    .tp_dealloc = (destructor)RouteTag_dealloc,
    .tp_methods = RouteTag_methods,
};

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
