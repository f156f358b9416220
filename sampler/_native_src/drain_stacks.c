/* The drain's stacks: a record's frames as a tuple of frame name ids (leaf first, as the
 * pure-Python engine builds them), asking the sampler's resolve() for the name of a code object
 * it has not seen; the walk found the sample's label set (tags.c). Runs under the GIL.
 */
#include "native.h"

int with_lineno;
PyObject *truncated_id, *waiting_id, *unknown_id;
PyObject *reason_ids; /* a tuple: the frame naming each wait_reason, None for unknown */

/* Whether the record's code object is alive now (so it may be dereferenced): held by the
 * cache since before the walk, or not freed since the walk began. */
static int code_alive(record_head *record, const void *code, code_entry *held)
{
    if (held != NULL && record->code_seq >= held->learned) {
        return 1;
    }
    return !freed_code_since(code, record->code_seq);
}

/* Returns a borrowed reference to the frame's name id, or NULL with an exception set. */
static PyObject *frame_name(drain_state *state, record_head *record, record_frame *frame)
{
    code_entry *held = codemap_get(frame->code, -1);
    if (!code_alive(record, frame->code, held)) {
        return unknown_id; /* freed before the drain could read its name */
    }
    if (held != NULL && !with_lineno) {
        return held->name;
    }
    code_entry *entry = with_lineno ? codemap_get(frame->code, frame->lasti) : NULL;
    if (entry != NULL) {
        return entry->name;
    }
    /* Alive: hold it before any Python code runs (and might free it). */
    PyObject *code = Py_NewRef((PyObject *)frame->code);
    PyObject *function = Py_None;
    if (frame->func != NULL && !freed_function_since(frame->func, record->function_seq)) {
        function = (PyObject *)frame->func;
    }
    Py_INCREF(function);
    int line = -1;
    if (with_lineno) {
        line = PyCode_Addr2Line((PyCodeObject *)code, (int)(frame->lasti * sizeof(_Py_CODEUNIT)));
    }
    PyObject *name = PyObject_CallFunction(state->resolve, "OOi", code, function, line);
    Py_DECREF(function);
    if (name != NULL) {
        /* The entry without a line holds the code object, from now on (see code_alive). */
        entry = held;
        if (entry == NULL) {
            entry = codemap_put(frame->code, -1, code, with_lineno ? Py_None : name,
                                freed_code_count());
        }
        if (entry != NULL && with_lineno) {
            entry = codemap_put(frame->code, frame->lasti, code, name, freed_code_count());
        }
        Py_DECREF(name);
    }
    Py_DECREF(code);
    return entry != NULL ? entry->name : NULL;
}

/* ``tuple``, no longer tracked by the garbage collector when none of its items is (frame and
 * label ids are ints): it can be in no cycle. The collector would untrack it at its next
 * collection anyway, after visiting it; a drain makes a few such tuples a sample (a stack, its
 * key, the sample the stall watcher keeps), so that visit was a collection's main cost. */
PyObject *untracked(PyObject *tuple)
{
    if (tuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        if (PyObject_GC_IsTracked(PyTuple_GET_ITEM(tuple, i))) {
            return tuple;
        }
    }
    PyObject_GC_UnTrack(tuple);
    return tuple;
}

/* The label set of the record's innermost tagged frame when it was taken (0: none). */
PyObject *label_of(record_head *record)
{
    return PyLong_FromUnsignedLong(record->label > 0 ? record->label - 1 : 0);
}

/* The frame naming a wait reason, or None. */
static PyObject *reason_frame(uint32_t reason)
{
    return reason < REASON_COUNT ? PyTuple_GET_ITEM(reason_ids, reason) : Py_None;
}

/* ``stack`` under [waiting] and what it waits on (leaf first: ...;[waiting];[socket]). */
PyObject *waiting_stack(PyObject *stack, uint32_t reason)
{
    PyObject *reason_id = reason_frame(reason);
    Py_ssize_t marks = 1 + (reason_id != Py_None), size = PyTuple_GET_SIZE(stack);
    PyObject *marked = PyTuple_New(marks + size);
    if (marked == NULL) {
        return NULL;
    }
    if (reason_id != Py_None) {
        PyTuple_SET_ITEM(marked, 0, Py_NewRef(reason_id));
    }
    PyTuple_SET_ITEM(marked, marks - 1, Py_NewRef(waiting_id));
    for (Py_ssize_t i = 0; i < size; i++) {
        PyTuple_SET_ITEM(marked, marks + i, Py_NewRef(PyTuple_GET_ITEM(stack, i)));
    }
    return untracked(marked);
}

PyObject *stack_of(drain_state *state, record_head *record, record_frame *frames)
{
    int waiting = (record->flags & FLAG_WAITING) != 0;
    int truncated = (record->flags & FLAG_TRUNCATED) != 0;
    int named = waiting && reason_frame(FLAG_REASON(record->flags)) != Py_None;
    PyObject *stack = PyTuple_New(named + waiting + (Py_ssize_t)record->depth + truncated);
    if (stack == NULL) {
        return NULL;
    }
    Py_ssize_t at = 0;
    if (named) { /* leaf first: ...;[waiting];[socket] */
        PyTuple_SET_ITEM(stack, at++, Py_NewRef(reason_frame(FLAG_REASON(record->flags))));
    }
    if (waiting) {
        PyTuple_SET_ITEM(stack, at++, Py_NewRef(waiting_id));
    }
    for (uint32_t i = 0; i < record->depth; i++) {
        PyObject *name = frame_name(state, record, &frames[i]);
        if (name == NULL) {
            Py_DECREF(stack);
            return NULL;
        }
        PyTuple_SET_ITEM(stack, at++, Py_NewRef(name));
    }
    if (truncated) {
        PyTuple_SET_ITEM(stack, at++, Py_NewRef(truncated_id));
    }
    return untracked(stack);
}
