/* A Starlette route's handler, named (sampler/middleware/_asgi.py's ``_named`` on the C path):
 * called, it names the request after the route's template, and gives an Awaiting (asgi.h)
 * of the handler's coroutine that, from its first step to its end, labels the samples under
 * its caller's frame with the route, as the Python path's wrapper coroutine labels those
 * under its own (and puts the route in the labels in force, for current_labels()). */
#include "asgi.h"
#include "module.h"

#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *handle;   /* the route's handler */
    PyObject *template; /* the route's path template: fleetflame_route */
    vectorcallfunc vectorcall;
} RouteHandle;

static PyObject *str_cr_frame;

/* The request's name in its state, scope[KEY][0] = route, if the middleware put one there. */
static int name_request(PyObject *scope, PyObject *route)
{
    PyObject *key = asgi_state_key();
    PyObject *state = key != NULL ? mapping_get(scope, key) : NULL;
    if (state == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int set = PySequence_SetItem(state, 0, route);
    Py_DECREF(state);
    return set;
}

/* The first step, the Python path's wrapper's body up to its ``await``: the request named,
 * the handler called, and its coroutine's frame labelled with the route (a handler that
 * gives another awaitable has no frame of its own to label: its samples go unlabelled, the
 * route in the labels in force all the same). */
static int route_start(Awaiting *self)
{
    PyObject *recorder = asgi_recorder(), *template = self->route;
    if (recorder == NULL || !labels_bound()) {
        return -1;
    }
    self->route = route_name(recorder, template, 0);
    Py_DECREF(template);
    if (self->route == NULL || name_request(self->scope, self->route) < 0) {
        return -1;
    }
    PyObject *call[3] = {self->scope, self->receive, self->send};
    PyObject *awaitable = PyObject_Vectorcall(self->callee, call, 3, NULL);
    if (awaitable == NULL) {
        return -1;
    }
    if (PyCoro_CheckExact(awaitable)) {
        self->frame = PyObject_GetAttr(awaitable, str_cr_frame);
        if (self->frame == Py_None) {
            Py_CLEAR(self->frame);
        }
    }
    /* With no coroutine frame to label, the tag is keyed on this object, which no sample
     * holds: the route is in the labels in force (current_labels(), tasks started inside),
     * its samples unlabelled. Opened before the awaitable's __await__ runs, as the Python
     * path's tag is. */
    const void *key = self->frame != NULL ? (const void *)self->frame : (const void *)self;
    PyObject *set = NULL;
    if (!PyErr_Occurred() && tag_ready(&self->tag, key) == 0) {
        set = tag_route(&self->tag, self->route);
    }
    Py_XDECREF(set);
    self->inner = set != NULL ? awaited_iterator(awaitable) : NULL;
    Py_DECREF(awaitable);
    if (self->inner == NULL) {
        awaiting_finish(self, 1); /* closes the tag, if it opened */
        return -1;
    }
    return 0;
}

static int route_end(Awaiting *self, int failed)
{
    (void)failed;
    return tag_close(&self->tag);
}

/* Called as the route's handler is, (scope, receive, send): an awaitable of the handler's
 * coroutine; nothing runs until its first step, as for the Python path's coroutine. */
static PyObject *RouteHandle_call(RouteHandle *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    static char *keywords[] = {"scope", "receive", "send", NULL};
    PyObject *scope, *receive, *send;
    if (kwnames == NULL && PyVectorcall_NARGS(nargsf) == 3) {
        scope = args[0], receive = args[1], send = args[2];
    } else {
        /* By keyword, as a coroutine function of (scope, receive, send) may be called. */
        Py_ssize_t count = PyVectorcall_NARGS(nargsf);
        PyObject *tuple = PyTuple_New(count);
        for (Py_ssize_t i = 0; tuple != NULL && i < count; i++) {
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        }
        PyObject *named = tuple != NULL && kwnames != NULL
                              ? _PyStack_AsDict(args + count, kwnames)
                              : NULL;
        int parsed = tuple != NULL && (kwnames == NULL || named != NULL) &&
                     PyArg_ParseTupleAndKeywords(tuple, named, "OOO:handle", keywords, &scope,
                                                 &receive, &send);
        Py_XDECREF(tuple);
        Py_XDECREF(named);
        if (!parsed) {
            return NULL;
        }
    }
    Awaiting *awaiting = awaiting_new(route_start, route_end);
    if (awaiting != NULL) {
        awaiting->callee = Py_NewRef(self->handle);
        awaiting->route = Py_NewRef(self->template); /* named at the first step */
        awaiting->scope = Py_NewRef(scope);
        awaiting->receive = Py_NewRef(receive);
        awaiting->send = Py_NewRef(send);
    }
    return (PyObject *)awaiting;
}

static PyObject *RouteHandle_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *handle, *template;
    if (!PyArg_ParseTuple(args, "OU:RouteHandle", &handle, &template) ||
        (kwargs != NULL && !_PyArg_NoKeywords("RouteHandle", kwargs))) {
        return NULL;
    }
    RouteHandle *self = (RouteHandle *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->handle = Py_NewRef(handle);
    self->template = Py_NewRef(template);
    self->vectorcall = (vectorcallfunc)RouteHandle_call;
    return (PyObject *)self;
}

static int RouteHandle_traverse(RouteHandle *self, visitproc visit, void *arg)
{
    Py_VISIT(self->handle);
    return 0;
}

static int RouteHandle_clear(RouteHandle *self)
{
    Py_CLEAR(self->handle);
    return 0;
}

static void RouteHandle_dealloc(RouteHandle *self)
{
    PyObject_GC_UnTrack(self);
    RouteHandle_clear(self);
    Py_CLEAR(self->template);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef RouteHandle_members[] = {
    {"fleetflame_route", T_OBJECT, offsetof(RouteHandle, template), READONLY,
     "the route's path template: a handler already named"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RouteHandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RouteHandle",
    .tp_basicsize = sizeof(RouteHandle),
    .tp_dealloc = (destructor)RouteHandle_dealloc,
    .tp_vectorcall_offset = offsetof(RouteHandle, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "RouteHandle(handle, template): a Starlette route's handler, named: its "
              "requests are the route's, their samples labelled with it.",
    .tp_traverse = (traverseproc)RouteHandle_traverse,
    .tp_clear = (inquiry)RouteHandle_clear,
    .tp_members = RouteHandle_members,
    .tp_new = RouteHandle_new,
};

int asgi_route_add_type(PyObject *module)
{
    if ((str_cr_frame = PyUnicode_InternFromString("cr_frame")) == NULL ||
        PyType_Ready(&RouteHandleType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "RouteHandle", (PyObject *)&RouteHandleType);
}
