/* An ASGI request's end (sampler/middleware/_asgi.py): what StatusSend returns for the
 * answer's last message when the server's send gave a coroutine. Awaiting it awaits that
 * coroutine; when the coroutine returns, it notes the monotonic time in the request's
 * state[2]; one that raises notes nothing (the request failed). It does what the Python
 * path's ``_answered`` coroutine does, without a coroutine and its frame a request (~2,100
 * instructions). It has a coroutine's four methods (__await__, send, throw, close), so
 * asyncio takes it for one (create_task, ensure_future), as it took the server's. */
#include "native.h"
#include "middleware.h"
#include "module.h"

typedef struct {
    PyObject_HEAD
    PyObject *sending; /* the server's send's coroutine */
    PyObject *state;   /* the request's [route, status, answered] list */
} Answering;

static PyObject *str_throw; /* str_close: middleware.h's */

/* The coroutine returned: state[2] = now. */
static int note_end(Answering *self)
{
    PyObject *now = PyFloat_FromDouble(monotonic_now());
    if (now == NULL) {
        return -1;
    }
    int set = PySequence_SetItem(self->state, 2, now);
    Py_DECREF(now);
    return set;
}

static PySendResult Answering_am_send(Answering *self, PyObject *arg, PyObject **result)
{
    PySendResult sent = PyIter_Send(self->sending, arg, result);
    if (sent == PYGEN_RETURN && note_end(self) < 0) {
        Py_CLEAR(*result);
        return PYGEN_ERROR;
    }
    return sent;
}

/* Ends an iteration that returned ``value`` (stolen): StopIteration(value), or none set for
 * None (unless ``always``: send's), which an iterator's next may leave unset. */
PyObject *asgi_returned(PyObject *value, int always)
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

static PyObject *Answering_send(Answering *self, PyObject *arg)
{
    PyObject *result;
    PySendResult sent = Answering_am_send(self, arg, &result);
    if (sent == PYGEN_NEXT) {
        return result;
    }
    return sent == PYGEN_RETURN ? asgi_returned(result, 1) : NULL;
}

static PyObject *Answering_next(Answering *self)
{
    PyObject *result;
    PySendResult sent = Answering_am_send(self, Py_None, &result);
    if (sent == PYGEN_NEXT) {
        return result;
    }
    return sent == PYGEN_RETURN ? asgi_returned(result, 0) : NULL;
}

/* throw(...) is passed to the coroutine's: if the coroutine returns from it (it caught the
 * exception), the answer was sent. */
static PyObject *Answering_throw(Answering *self, PyObject *args)
{
    PyObject *throw = PyObject_GetAttr(self->sending, str_throw);
    if (throw == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Call(throw, args, NULL);
    Py_DECREF(throw);
    if (result == NULL && PyErr_ExceptionMatches(PyExc_StopIteration)) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (note_end(self) < 0) {
            Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(traceback);
            return NULL;
        }
        PyErr_Restore(type, value, traceback);
    }
    return result;
}

/* Raises what throw(type[, value[, traceback]]) or throw(exception) was given. */
PyObject *asgi_raise_thrown(PyObject *args)
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

static PyObject *Answering_close(Answering *self, PyObject *unused)
{
    (void)unused;
    return PyObject_CallMethodNoArgs(self->sending, str_close);
}

static PyObject *Answering_await(Answering *self)
{
    return Py_NewRef(self);
}

static int Answering_traverse(Answering *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sending);
    Py_VISIT(self->state);
    return 0;
}

static int Answering_clear(Answering *self)
{
    Py_CLEAR(self->sending);
    Py_CLEAR(self->state);
    return 0;
}

static void Answering_dealloc(Answering *self)
{
    PyObject_GC_UnTrack(self);
    Answering_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Answering_methods[] = {
    {"send", (PyCFunction)Answering_send, METH_O, "send(value): the coroutine's send."},
    {"throw", (PyCFunction)Answering_throw, METH_VARARGS, "throw(...): the coroutine's throw."},
    {"close", (PyCFunction)Answering_close, METH_NOARGS, "close(): the coroutine's close."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods Answering_async = {
    .am_await = (unaryfunc)Answering_await,
    .am_send = (sendfunc)Answering_am_send,
};

static PyTypeObject AnsweringType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.Answering",
    .tp_basicsize = sizeof(Answering),
    .tp_dealloc = (destructor)Answering_dealloc,
    .tp_as_async = &Answering_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The ASGI server's send of a request's last message, awaited: notes the "
              "request's end when it returns.",
    .tp_traverse = (traverseproc)Answering_traverse,
    .tp_clear = (inquiry)Answering_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Answering_next,
    .tp_methods = Answering_methods,
};

PyObject *asgi_answering(PyObject *sending, PyObject *state)
{
    Answering *self = PyObject_GC_New(Answering, &AnsweringType);
    if (self == NULL) {
        return NULL;
    }
    self->sending = Py_NewRef(sending);
    self->state = Py_NewRef(state);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

int asgi_answer_ready(void)
{
    str_throw = PyUnicode_InternFromString("throw");
    return str_throw == NULL ? -1 : PyType_Ready(&AnsweringType);
}
