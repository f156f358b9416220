/* Awaiting (asgi.h): the C path's stand-in for the ASGI middleware's Python coroutines. A
 * coroutine and its frame cost ~2,000-4,000 instructions a request; this passes each step on
 * to what it awaits and calls its hooks where the coroutine's body and ``finally`` ran.
 * Everything below runs under the GIL. */
#include "asgi.h"

static PyObject *str_throw_name, *str_get_name, *str_name, *str_qualname;
static PyTypeObject AwaitingType;

PyObject *mapping_get(PyObject *mapping, PyObject *key)
{
    if (PyDict_CheckExact(mapping)) {
        return Py_XNewRef(PyDict_GetItemWithError(mapping, key));
    }
    PyObject *value = PyObject_CallMethodObjArgs(mapping, str_get_name, key, NULL);
    if (value == Py_None) {
        Py_CLEAR(value);
    }
    return value;
}

PyObject *awaited_iterator(PyObject *awaitable)
{
    if (PyCoro_CheckExact(awaitable)) {
        return Py_NewRef(awaitable);
    }
    if (PyGen_CheckExact(awaitable)) { /* a generator-based coroutine (types.coroutine) only */
        PyCodeObject *code = ((PyGenObject *)awaitable)->gi_code;
        if (code->co_flags & CO_ITERABLE_COROUTINE) {
            return Py_NewRef(awaitable);
        }
    }
    PyAsyncMethods *async = Py_TYPE(awaitable)->tp_as_async;
    if (async == NULL || async->am_await == NULL) {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression",
                     Py_TYPE(awaitable)->tp_name);
        return NULL;
    }
    PyObject *iterator = async->am_await(awaitable);
    if (iterator != NULL && (PyCoro_CheckExact(iterator) || !PyIter_Check(iterator))) {
        PyErr_Format(PyExc_TypeError,
                     PyCoro_CheckExact(iterator) ? "__await__() returned a coroutine"
                                                 : "__await__() returned non-iterator of type '%.100s'",
                     Py_TYPE(iterator)->tp_name);
        Py_CLEAR(iterator);
    }
    return iterator;
}

/* The end, once, whatever exception is in flight, which is kept: an error of a hook's is not
 * the app's (printed as unraisable: the host must not fail by the sampler). */
void awaiting_finish(Awaiting *self, int failed)
{
    if (self->ended) {
        return;
    }
    self->ended = 1;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (self->end(self, failed) < 0) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    PyErr_Restore(type, value, traceback);
}

/* The errors a coroutine gives for a step it cannot take: 0 if it can. */
static int cannot_step(Awaiting *self)
{
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return -1;
    }
    if (self->ended || (self->begun && self->inner == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return -1;
    }
    return 0;
}

/* What the awaiting gives when ``inner`` returned ``*result``: that, or None. */
static void given(Awaiting *self, PyObject **result)
{
    if (!self->gives_result) {
        Py_SETREF(*result, Py_NewRef(Py_None));
    }
}

static PySendResult Awaiting_am_send(Awaiting *self, PyObject *arg, PyObject **result)
{
    *result = NULL;
    if (cannot_step(self) < 0) {
        return PYGEN_ERROR;
    }
    if (!self->begun) {
        if (arg != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        self->begun = self->running = 1;
        int started = self->start != NULL ? self->start(self) : 0;
        self->running = 0;
        if (started < 0) {
            self->ended = 1; /* what the start did not end failed before the request began */
            return PYGEN_ERROR;
        }
    }
    self->running = 1;
    PySendResult sent = PyIter_Send(self->inner, arg, result);
    self->running = 0;
    if (sent == PYGEN_RETURN) {
        given(self, result);
        awaiting_finish(self, 0);
    } else if (sent == PYGEN_ERROR) {
        awaiting_finish(self, 1);
    }
    return sent;
}

/* Ends an iteration that returned ``value`` (stolen): StopIteration(value), or none set for
 * None (unless ``always``, as send() must), which an iterator's next may leave unset. */
static PyObject *returned(PyObject *value, int always)
{
    if (value == Py_None && !always) {
        Py_DECREF(value);
        return NULL;
    }
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value);
    Py_DECREF(value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *Awaiting_send(Awaiting *self, PyObject *arg)
{
    PyObject *result;
    PySendResult sent = Awaiting_am_send(self, arg, &result);
    return sent == PYGEN_NEXT ? result : sent == PYGEN_RETURN ? returned(result, 1) : NULL;
}

static PyObject *Awaiting_next(Awaiting *self)
{
    PyObject *result;
    PySendResult sent = Awaiting_am_send(self, Py_None, &result);
    return sent == PYGEN_NEXT ? result : sent == PYGEN_RETURN ? returned(result, 0) : NULL;
}

/* Raises what throw(type[, value[, traceback]]) or throw(exception) was given. */
static PyObject *raise_thrown(PyObject *args)
{
    PyObject *thrown = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : NULL;
    PyObject *value = PyTuple_GET_SIZE(args) > 1 ? PyTuple_GET_ITEM(args, 1) : NULL;
    if (thrown != NULL && PyExceptionInstance_Check(thrown)) {
        PyErr_SetObject((PyObject *)Py_TYPE(thrown), thrown);
    } else if (thrown != NULL && PyExceptionClass_Check(thrown)) {
        PyErr_SetObject(thrown, value);
    } else {
        PyErr_SetString(PyExc_TypeError, "throw() takes an exception");
    }
    return NULL;
}

/* A StopIteration raised in a coroutine's body leaves it as a RuntimeError (PEP 479). */
static void stop_iteration_escaped(void)
{
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyErr_SetString(PyExc_RuntimeError, "coroutine raised StopIteration");
    PyObject *type2, *error, *traceback2;
    PyErr_Fetch(&type2, &error, &traceback2);
    PyErr_NormalizeException(&type2, &error, &traceback2);
    if (error != NULL && value != NULL) {
        PyException_SetCause(error, Py_NewRef(value));
        PyException_SetContext(error, Py_NewRef(value));
    }
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(traceback);
    PyErr_Restore(type2, error, traceback2);
}

/* throw(...) (a cancellation): thrown into what is awaited, by its throw (else raised where
 * it is awaited, as await does); it ends if that ends by it, by a return if it caught the
 * exception. Thrown before the first step, it is raised at once and the body never runs, as
 * for a coroutine. */
static PyObject *Awaiting_throw(Awaiting *self, PyObject *args)
{
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return NULL;
    }
    if (!self->begun || self->ended || self->inner == NULL) {
        self->ended = self->ended || !self->begun;
        return raise_thrown(args);
    }
    PyObject *throw = NULL, *result = NULL;
    self->running = 1;
    if (_PyObject_LookupAttr(self->inner, str_throw_name, &throw) > 0) {
        result = PyObject_Call(throw, args, NULL);
        Py_DECREF(throw);
    } else if (!PyErr_Occurred()) {
        raise_thrown(args);
        stop_iteration_escaped();
    }
    self->running = 0;
    if (result != NULL) {
        return result;
    }
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
        awaiting_finish(self, 1);
        return NULL;
    }
    if (!self->gives_result) { /* it returned: the awaiting returns None */
        PyErr_Clear();
        PyErr_SetNone(PyExc_StopIteration);
    }
    awaiting_finish(self, 0);
    return NULL;
}

/* close(): before the first step it only marks the awaiting done, as for a coroutine; after
 * it, what is awaited is closed and the awaiting ends as failed. */
static PyObject *Awaiting_close(Awaiting *self, PyObject *unused)
{
    (void)unused;
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return NULL;
    }
    if (self->ended || !self->begun || self->inner == NULL) {
        self->ended = 1;
        Py_RETURN_NONE;
    }
    PyObject *close = NULL, *closed = NULL;
    self->running = 1;
    if (_PyObject_LookupAttr(self->inner, str_close, &close) >= 0) {
        closed = close != NULL ? PyObject_CallNoArgs(close) : Py_NewRef(Py_None);
        Py_XDECREF(close);
    }
    self->running = 0;
    awaiting_finish(self, 1);
    return closed;
}

static void Awaiting_finalize(Awaiting *self)
{
    if (!self->begun || self->ended || self->running || self->inner == NULL) {
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *closed = Awaiting_close(self, NULL);
    if (closed == NULL) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    Py_XDECREF(closed);
    PyErr_Restore(type, value, traceback);
}

/* Awaited: itself, unless a coroutine could not be awaited either. */
static PyObject *Awaiting_await(Awaiting *self)
{
    if (self->ended) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return NULL;
    }
    if (self->begun) {
        PyErr_SetString(PyExc_RuntimeError, "coroutine is being awaited already");
        return NULL;
    }
    return Py_NewRef(self);
}

/* Its name (a stalled task's, say): what it awaits', once begun. */
static PyObject *Awaiting_name(Awaiting *self, void *qualified)
{
    PyObject *name = NULL;
    if (self->inner != NULL &&
        _PyObject_LookupAttr(self->inner, qualified ? str_qualname : str_name, &name) < 0) {
        return NULL;
    }
    return name != NULL ? name : PyUnicode_FromString("Awaiting");
}

static PyObject *Awaiting_awaited(Awaiting *self, void *unused)
{
    (void)unused;
    return Py_NewRef(self->inner != NULL && !self->ended ? self->inner : Py_None);
}

static PyGetSetDef Awaiting_getset[] = {
    {"__name__", (getter)Awaiting_name, NULL, "what it awaits' name", NULL},
    {"__qualname__", (getter)Awaiting_name, NULL, "what it awaits' qualified name", ""},
    {"cr_await", (getter)Awaiting_awaited, NULL, "what it awaits, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int Awaiting_traverse(Awaiting *self, visitproc visit, void *arg)
{
    Py_VISIT(self->inner);
    Py_VISIT(self->callee);
    Py_VISIT(self->scope);
    Py_VISIT(self->receive);
    Py_VISIT(self->send);
    Py_VISIT(self->state);
    Py_VISIT(self->frame);
    return 0;
}

static int Awaiting_clear(Awaiting *self)
{
    Py_CLEAR(self->inner);
    Py_CLEAR(self->callee);
    Py_CLEAR(self->scope);
    Py_CLEAR(self->receive);
    Py_CLEAR(self->send);
    Py_CLEAR(self->state);
    Py_CLEAR(self->frame);
    return 0;
}

static void Awaiting_dealloc(Awaiting *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    Awaiting_clear(self);
    Py_CLEAR(self->header);
    Py_CLEAR(self->route);
    tag_forget(&self->tag);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Awaiting_methods[] = {
    {"send", (PyCFunction)Awaiting_send, METH_O, "send(value): the awaited's send."},
    {"throw", (PyCFunction)Awaiting_throw, METH_VARARGS, "throw(...): the awaited's throw."},
    {"close", (PyCFunction)Awaiting_close, METH_NOARGS, "close(): the awaited's close."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods Awaiting_async = {
    .am_await = (unaryfunc)Awaiting_await,
    .am_send = (sendfunc)Awaiting_am_send,
};

static PyTypeObject AwaitingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.Awaiting",
    .tp_basicsize = sizeof(Awaiting),
    .tp_dealloc = (destructor)Awaiting_dealloc,
    .tp_as_async = &Awaiting_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What the ASGI middleware's C path awaits where its Python path has a "
              "coroutine: an ASGI request, a route's handler or an answer's last send.",
    .tp_traverse = (traverseproc)Awaiting_traverse,
    .tp_clear = (inquiry)Awaiting_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Awaiting_next,
    .tp_methods = Awaiting_methods,
    .tp_getset = Awaiting_getset,
    .tp_finalize = (destructor)Awaiting_finalize,
};

Awaiting *awaiting_new(awaiting_hook start, awaiting_end end)
{
    Awaiting *self = (Awaiting *)AwaitingType.tp_alloc(&AwaitingType, 0);
    if (self != NULL) {
        self->start = start;
        self->end = end;
    }
    return self;
}

int asgi_await_ready(void)
{
    if ((str_throw_name = PyUnicode_InternFromString("throw")) == NULL ||
        (str_get_name = PyUnicode_InternFromString("get")) == NULL ||
        (str_name = PyUnicode_InternFromString("__name__")) == NULL ||
        (str_qualname = PyUnicode_InternFromString("__qualname__")) == NULL) {
        return -1;
    }
    return PyType_Ready(&AwaitingType);
}
