/* sampler._native: the Python face of the native engine, and the drain.
 *
 * The drain runs under the GIL. It turns each record into a stack of frame name ids (leaf
 * first, as the pure-Python engine builds them), asking the sampler's resolve() for the name
 * of a code object it has not seen; the walk found the sample's label set (tags.c).
 */
#include "native.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#define MAX_DEPTH 4096
#define MIN_INTERVAL 1e-4 /* seconds */
#define MAX_INTERVAL 3600.0

static int started;

static int valid_interval(double interval)
{
    return isfinite(interval) && interval >= MIN_INTERVAL && interval <= MAX_INTERVAL;
}
static int with_lineno;
static PyObject *truncated_id, *waiting_id, *unknown_id;
static PyObject *reason_ids; /* a tuple: the frame naming each wait_reason, None for unknown */

/* -- start, stop, threads ------------------------------------------------------------------ */

/* Waits (the GIL let go) until no handler is past its first check: one that was preempted
 * mid-walk at stop must commit before the last drain, and never write into a ring reset for
 * the next start. Bounded: a thread stopped by a debugger must not hang the host. */
static void wait_for_handlers(void)
{
    Py_BEGIN_ALLOW_THREADS
    struct timespec pause = {0, 100000};
    for (int i = 0; i < 10000 && atomic_load(&handlers_running) > 0; i++) {
        nanosleep(&pause, NULL);
    }
    Py_END_ALLOW_THREADS
}

static PyObject *native_start(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *keywords[] = {"mode", "interval", "max_depth", "lineno", "markers", "ring_bytes",
                               NULL};
    const char *mode;
    double interval;
    unsigned int max_depth;
    int lineno;
    PyObject *markers;
    Py_ssize_t ring_bytes = 1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sdIpO!|n", keywords, &mode, &interval,
                                     &max_depth, &lineno, &PyTuple_Type, &markers, &ring_bytes)) {
        return NULL;
    }
    if (started) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine is already running");
        return NULL;
    }
    if (PyTuple_GET_SIZE(markers) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(markers, 3)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(markers, 3)) != REASON_COUNT || !valid_interval(interval) || max_depth == 0 ||
        max_depth > MAX_DEPTH || ring_bytes < 65536 || (ring_bytes & (ring_bytes - 1)) != 0 ||
        (uint64_t)ring_bytes < 4 * (sizeof(record_head) + (uint64_t)max_depth * sizeof(record_frame))) {
        PyErr_SetString(PyExc_ValueError, "bad native engine settings");
        return NULL;
    }
    wait_for_handlers();
    if (ring.data == NULL || ring.capacity != (uint64_t)ring_bytes) {
        ring_free(&ring);
        if (ring_init(&ring, (uint64_t)ring_bytes) != 0) {
            return PyErr_NoMemory();
        }
    } else {
        ring_reset(&ring);
    }
    if (guard_install() != 0) {
        if (errno == EBUSY) {
            PyErr_SetString(PyExc_RuntimeError,
                            "another SIGSEGV or SIGBUS handler replaced the native engine's "
                            "fault guard since it last ran");
            return NULL;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (handler_install() != 0) {
        if (errno == EBUSY) {
            PyErr_SetString(PyExc_RuntimeError, "SIGPROF already has a handler");
            return NULL;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    freed_watch();
    codemap_clear(); /* its ids belong to the table of an earlier start */
    Py_XSETREF(truncated_id, Py_NewRef(PyTuple_GET_ITEM(markers, 0)));
    Py_XSETREF(waiting_id, Py_NewRef(PyTuple_GET_ITEM(markers, 1)));
    Py_XSETREF(unknown_id, Py_NewRef(PyTuple_GET_ITEM(markers, 2)));
    Py_XSETREF(reason_ids, Py_NewRef(PyTuple_GET_ITEM(markers, 3)));
    memset(&stats, 0, sizeof(stats));
    engine_wall = strcmp(mode, "wall") == 0;
    engine_max_depth = max_depth;
    with_lineno = lineno;
    threads_init();
    threads_set_interval((uint64_t)(interval * 1e9));
    atomic_store(&engine_active, 1);
    if (engine_wall && wall_start() != 0) {
        atomic_store(&engine_active, 0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    started = 1;
    Py_RETURN_NONE;
}

static PyObject *native_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (started) {
        atomic_store(&engine_active, 0);
        wall_stop();
        threads_clear();
        started = 0;
        wait_for_handlers();
    }
    Py_RETURN_NONE;
}

static PyObject *native_release(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!started) {
        freed_drained(1);
        freed_unwatch();
        codemap_clear();
    }
    Py_RETURN_NONE;
}

static PyObject *native_after_fork_child(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    atomic_store(&engine_active, 0);
    /* A handler that ran on another thread at the fork never finishes here. */
    atomic_store(&handlers_running, 0);
    tags_after_fork();
    middleware_tags_kept(0);
    threads_after_fork();
    if (ring.data != NULL) {
        ring_reset(&ring);
    }
    started = 0;
    Py_RETURN_NONE;
}

static PyObject *native_register_current_thread(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!started || threads_add_current() != 0) {
        Py_RETURN_FALSE;
    }
    /* Its stack now, the thread's entry: where its last CPU goes if it ends unsampled. */
    PyThreadState *tstate = PyThreadState_Get();
    record_stack(tstate, 0, FLAG_ENTRY, tstate->thread_id);
    Py_RETURN_TRUE;
}

static PyObject *native_sync_threads(PyObject *module, PyObject *excluded)
{
    (void)module;
    if (!PyAnySet_Check(excluded)) {
        PyErr_SetString(PyExc_TypeError, "sync_threads() takes a set of thread idents");
        return NULL;
    }
    if (!started) {
        return PySet_New(NULL);
    }
    return threads_sync(excluded);
}

static PyObject *native_pause_thread(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned long ident;
    int paused;
    if (!PyArg_ParseTuple(args, "kp", &ident, &paused)) {
        return NULL;
    }
    if (started && threads_pause(ident, paused) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *native_pause_all(PyObject *module, PyObject *arg)
{
    (void)module;
    int paused = PyObject_IsTrue(arg);
    if (paused < 0) {
        return NULL;
    }
    if (started && threads_pause_all(paused) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *native_set_interval(PyObject *module, PyObject *arg)
{
    (void)module;
    double interval = PyFloat_AsDouble(arg);
    if (interval == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!valid_interval(interval)) {
        PyErr_SetString(PyExc_ValueError, "the interval must be from 0.0001 to 3600 seconds");
        return NULL;
    }
    if (threads_set_interval((uint64_t)(interval * 1e9)) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* The pid tracing this process's main thread (TracerPid in /proc/self/status), or 0: read
 * ten times a second, so without Python file objects. */
static PyObject *native_tracer_pid(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    char text[4096];
    ssize_t length = -1;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        length = read(fd, text, sizeof(text) - 1);
        close(fd);
    }
    long pid = 0;
    if (length > 0) {
        text[length] = 0;
        const char *found = strstr(text, "\nTracerPid:");
        if (found != NULL) {
            pid = strtol(found + sizeof("\nTracerPid:") - 1, NULL, 10);
        }
    }
    return PyLong_FromLong(pid);
}

/* Sleeps ``seconds`` without the GIL, then takes it back. Returns how long taking it back
 * took (a thread holding the GIL that long kept every other from running Python), and, about
 * the thread that held it as this one asked for it back: its ident (None if none did, or it
 * cannot be told: started during the sleep, or its state reused), its seconds on a CPU over
 * the wait if that lasted ``threshold`` seconds or more (None where its clock could not be
 * read: it has ended), and how many times the GIL passed to yet another thread meanwhile.
 * ``own``: idents of the sampler's threads, which are let pass the GIL on before it is asked
 * for (see gil_watch_pass_own). */
static PyObject *native_watch_wake(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    gil_alarm_wake();
    Py_RETURN_NONE;
}

static PyObject *native_gil_wait(PyObject *module, PyObject *args)
{
    (void)module;
    double seconds, threshold;
    PyObject *own = Py_None;
    if (!PyArg_ParseTuple(args, "dd|O", &seconds, &threshold, &own)) {
        return NULL;
    }
    if (!(seconds >= 0 && seconds <= 10) || !(threshold >= 0)) {
        PyErr_SetString(PyExc_ValueError, "gil_wait() sleeps from 0 to 10 seconds");
        return NULL;
    }
    gil_watch watch;
    if (own != Py_None && !PyAnySet_Check(own)) {
        PyErr_SetString(PyExc_TypeError, "gil_wait(): own must be a set of thread idents");
        return NULL;
    }
    double waited = gil_wait_once(seconds, threshold, &watch, own == Py_None ? NULL : own);
    PyObject *result = gil_wait_result(waited, &watch);
    gil_watch_release(&watch);
    return result;
}

static PyObject *native_wait_reason(PyObject *module, PyObject *arg)
{
    (void)module;
    long tid = PyLong_AsLong(arg);
    if (tid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int reason;
    Py_BEGIN_ALLOW_THREADS
    reason = wait_reason((pid_t)tid);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(reason);
}

static PyObject *native_hide_code(PyObject *module, PyObject *code)
{
    (void)module;
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "hide_code() takes a code object");
        return NULL;
    }
    int count = atomic_load(&hidden_count);
    for (int i = 0; i < count; i++) {
        if (hidden_codes[i] == code) {
            Py_RETURN_TRUE;
        }
    }
    if (count >= MAX_HIDDEN_CODES) {
        Py_RETURN_FALSE;
    }
    /* Held for good, and published after it is in place: a walk on another thread may be
     * comparing against it. Only the GIL holder appends. */
    hidden_codes[count] = Py_NewRef(code);
    atomic_store(&hidden_count, count + 1);
    Py_RETURN_TRUE;
}

static PyObject *native_handler_ns(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&stats.handler_ns));
}

static PyObject *native_handlers_are_ours(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(handler_is_ours() && guard_is_ours());
}

static PyObject *native_tag_set(PyObject *module, PyObject *const *args, Py_ssize_t count)
{
    (void)module;
    if (count != 2) {
        PyErr_SetString(PyExc_TypeError, "tag_set(frame_id, label_set) takes 2 arguments");
        return NULL;
    }
    void *frame = PyLong_AsVoidPtr(args[0]);
    long set = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyBool_FromLong(tags_set(frame, set) == 0);
}

static PyObject *native_tags_load(PyObject *module, PyObject *tags)
{
    (void)module;
    if (!PyDict_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tags_load takes a dict");
        return NULL;
    }
    tags_clear();
    middleware_tags_kept(1);
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(tags, &at, &key, &value)) {
        void *frame = PyLong_AsVoidPtr(key);
        long set = PyLong_AsLong(value);
        if (PyErr_Occurred()) {
            return NULL;
        }
        tags_set(frame, set);
    }
    Py_RETURN_NONE;
}

static PyObject *native_tags_clear(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    middleware_tags_kept(0);
    tags_clear();
    Py_RETURN_NONE;
}

static PyObject *native_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsnsKsnsKsK}", "samples", (unsigned long long)atomic_load(&stats.samples),
        "torn", (unsigned long long)atomic_load(&stats.torn),
        "weight", (unsigned long long)atomic_load(&stats.weight), "dropped",
        (unsigned long long)atomic_load(&stats.dropped), "faults",
        (unsigned long long)atomic_load(&stats.faults), "no_python",
        (unsigned long long)atomic_load(&stats.no_python), "handler_ns",
        (unsigned long long)atomic_load(&stats.handler_ns), "signals",
        (unsigned long long)atomic_load(&stats.signals), "threads", threads_count(),
        "timer_failures", (unsigned long long)threads_timer_failures(), "names_cached",
        codemap_size(), "tags_open", (unsigned long long)tags_open(), "tags_lost",
        (unsigned long long)tags_lost());
}

/* -- the drain ------------------------------------------------------------------------------- */

typedef struct {
    PyObject *resolve;    /* resolve(code, function or None, line or -1) -> frame name id */
    count_sink sink;      /* the table counted into */
    PyObject *thread_root; /* thread_root(ident) -> a [thread:NAME] name id, or None */
    /* thread ident -> the key of its last sample, of its entry stack, of its last waiting one */
    PyObject *last_key, *entry_key, *last_waiting;
    PyObject *recent; /* appended (seconds, ident, key, weight) for every sample, or None */
    Py_ssize_t records;
    long long added, dropped;
} drain_state;

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

/* The label set of the record's innermost tagged frame when it was taken (0: none). */
/* ``tuple``, no longer tracked by the garbage collector when none of its items is (frame and
 * label ids are ints): it can be in no cycle. The collector would untrack it at its next
 * collection anyway, after visiting it; a drain makes a few such tuples a sample (a stack, its
 * key, the sample the stall watcher keeps), so that visit was a collection's main cost. */
static PyObject *untracked(PyObject *tuple)
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

static PyObject *label_of(record_head *record)
{
    return PyLong_FromUnsignedLong(record->label > 0 ? record->label - 1 : 0);
}

/* The frame naming a wait reason, or None. */
static PyObject *reason_frame(uint32_t reason)
{
    return reason < REASON_COUNT ? PyTuple_GET_ITEM(reason_ids, reason) : Py_None;
}

/* ``stack`` under [waiting] and what it waits on (leaf first: ...;[waiting];[socket]). */
static PyObject *waiting_stack(PyObject *stack, uint32_t reason)
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

static PyObject *stack_of(drain_state *state, record_head *record, record_frame *frames)
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

/* Pops ``key`` from ``dict``: a new reference, or NULL (absent, or with an exception set). */
static PyObject *pop(PyObject *dict, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL) {
        return NULL;
    }
    Py_INCREF(value);
    if (PyDict_DelItem(dict, key) < 0) {
        Py_DECREF(value);
        return NULL;
    }
    return value;
}

static int forget(PyObject *dict, PyObject *key)
{
    PyObject *value = pop(dict, key);
    Py_XDECREF(value);
    return PyErr_Occurred() ? -1 : 0;
}

static int add(drain_state *state, PyObject *key, double weight)
{
    long long added = count_add(&state->sink, key, weight);
    state->added += added;
    return added < 0 ? -1 : 0;
}

/* A thread ended (its CPU no tick noticed goes where it was last seen, or to its entry stack)
 * or waited on where it was last read waiting. */
static int count_marker(drain_state *state, record_head *record, PyObject *ident)
{
    PyObject *key;
    if (record->flags & FLAG_EXIT) {
        key = pop(state->last_key, ident);
        if (key == NULL && !PyErr_Occurred()) {
            key = Py_XNewRef(PyDict_GetItemWithError(state->entry_key, ident));
        }
        if (PyErr_Occurred() || forget(state->entry_key, ident) < 0 ||
            forget(state->last_waiting, ident) < 0) {
            Py_XDECREF(key);
            return -1;
        }
    } else {
        key = Py_XNewRef(PyDict_GetItemWithError(state->last_waiting, ident));
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    if (key == NULL) {
        state->dropped += (long long)record->weight;
        return 0;
    }
    int result = add(state, key, (double)record->weight);
    Py_DECREF(key);
    return result;
}

static int count_sample(drain_state *state, record_head *record, PyObject *ident,
                        PyObject *label, PyObject *stack)
{
    if (record->flags & FLAG_ENTRY) {
        /* Its stack as it registered itself, less the hook that did it. A new thread may reuse
         * an ended one's ident: nothing of that one is kept. */
        PyObject *entry = untracked(PyTuple_GetSlice(stack, 1, PyTuple_GET_SIZE(stack)));
        PyObject *key = entry == NULL ? NULL : untracked(PyTuple_Pack(2, label, entry));
        Py_XDECREF(entry);
        int result = key == NULL || PyDict_SetItem(state->entry_key, ident, key) < 0 ||
                             forget(state->last_key, ident) < 0 ||
                             forget(state->last_waiting, ident) < 0
                         ? -1
                         : 0;
        Py_XDECREF(key);
        return result;
    }
    PyObject *key = untracked(PyTuple_Pack(2, label, stack));
    if (key == NULL || PyDict_SetItem(state->last_key, ident, key) < 0) {
        Py_XDECREF(key);
        return -1;
    }
    double weight = (double)record->weight;
    uint32_t on_cpu = record->flags >> FLAG_ON_CPU_SHIFT;
    int result = 0;
    if (record->flags & FLAG_WAITING) {
        result = PyDict_SetItem(state->last_waiting, ident, key);
    } else if (on_cpu) {
        /* Wall mode: the thread ran for this share of its interval and waited (for a core,
         * or otherwise) for the rest, where it is now. */
        double running = weight * on_cpu / 1000.0;
        PyObject *marked = waiting_stack(stack, FLAG_REASON(record->flags));
        if (marked == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *waited = untracked(PyTuple_Pack(2, label, marked));
        Py_DECREF(marked);
        result = waited == NULL ? -1 : add(state, waited, weight - running);
        Py_XDECREF(waited);
        weight = running;
    }
    if (result == 0) {
        result = add(state, key, weight);
    }
    if (result == 0 && state->recent != Py_None) {
        /* Kept a while, so a stall or a slow request can find what its thread was doing. */
        PyObject *sample = untracked(Py_BuildValue("(dOOd)", (double)record->time_ns / 1e9,
                                                   ident, key, (double)record->weight));
        PyObject *done = sample == NULL ? NULL : PyObject_CallOneArg(state->recent, sample);
        Py_XDECREF(sample);
        result = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(key);
    return result;
}

static int visit(record_head *record, void *arg)
{
    drain_state *state = arg;
    PyObject *ident = PyLong_FromUnsignedLong((unsigned long)record->ident);
    if (ident == NULL) {
        return -1;
    }
    int result;
    if (record->flags & (FLAG_REPEAT | FLAG_EXIT)) {
        result = count_marker(state, record, ident);
    } else {
        record_frame *frames = (record_frame *)(record + 1);
        PyObject *stack = stack_of(state, record, frames);
        PyObject *label = stack == NULL ? NULL : label_of(record);
        if (label != NULL && state->thread_root != Py_None) {
            PyObject *root = PyObject_CallOneArg(state->thread_root, ident);
            PyObject *rooted = root == NULL ? NULL : PyTuple_New(PyTuple_GET_SIZE(stack) + 1);
            if (rooted != NULL) {
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(stack); i++) {
                    PyTuple_SET_ITEM(rooted, i, Py_NewRef(PyTuple_GET_ITEM(stack, i)));
                }
                PyTuple_SET_ITEM(rooted, PyTuple_GET_SIZE(stack), Py_NewRef(root));
            }
            Py_XDECREF(root);
            Py_SETREF(stack, untracked(rooted));
        }
        result = stack == NULL || label == NULL
                     ? -1
                     : count_sample(state, record, ident, label, stack);
        Py_XDECREF(stack);
        Py_XDECREF(label);
    }
    Py_DECREF(ident);
    state->records++;
    return result;
}

/* Reads the attributes of ``table`` (a sampler._engine_native.DrainTarget) into the state. */
static int read_target(drain_state *state, PyObject *target)
{
    PyObject *max_stacks = PyObject_GetAttrString(target, "max_stacks");
    state->sink.max_stacks = max_stacks == NULL ? -1 : PyLong_AsSsize_t(max_stacks);
    Py_XDECREF(max_stacks);
    PyObject **fields[] = {&state->sink.counts,   &state->sink.touched, &state->sink.residues,
                           &state->sink.generation, &state->sink.other, &state->thread_root,
                           &state->last_key,      &state->entry_key,   &state->last_waiting,
                           &state->recent};
    const char *names[] = {"counts", "touched", "residues", "generation", "other", "thread_root",
                           "last_key", "entry_key", "last_waiting", "recent"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *fields[i] = PyObject_GetAttrString(target, names[i]);
        if (*fields[i] == NULL) {
            return -1;
        }
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *dicts[] = {state->sink.counts, state->sink.touched, state->sink.residues,
                         state->last_key, state->entry_key, state->last_waiting};
    for (size_t i = 0; i < sizeof(dicts) / sizeof(dicts[0]); i++) {
        if (!PyDict_Check(dicts[i])) {
            PyErr_SetString(PyExc_TypeError, "drain target: expected dicts");
            return -1;
        }
    }
    if (!PyTuple_Check(state->sink.other)) {
        PyErr_SetString(PyExc_TypeError, "drain target: other must be a tuple");
        return -1;
    }
    return 0;
}

static void release_target(drain_state *state)
{
    Py_CLEAR(state->sink.counts);
    Py_CLEAR(state->sink.touched);
    Py_CLEAR(state->sink.residues);
    Py_CLEAR(state->sink.generation);
    Py_CLEAR(state->sink.other);
    Py_CLEAR(state->thread_root);
    Py_CLEAR(state->last_key);
    Py_CLEAR(state->entry_key);
    Py_CLEAR(state->last_waiting);
    Py_CLEAR(state->recent);
}

static uint64_t drain_random = 0x2545f4914f6cdd1dull;

static PyObject *native_drain(PyObject *module, PyObject *args)
{
    (void)module;
    drain_state state;
    memset(&state, 0, sizeof(state));
    PyObject *target;
    if (!PyArg_ParseTuple(args, "OO", &state.resolve, &target)) {
        return NULL;
    }
    if (ring.data == NULL || truncated_id == NULL) {
        return Py_BuildValue("(nLLK)", (Py_ssize_t)0, 0LL, 0LL, 0ULL);
    }
    if (read_target(&state, target) < 0) {
        release_target(&state);
        return NULL;
    }
    if (started && engine_wall) {
        threads_flush_repeats();
    }
    state.sink.random = drain_random;
    freed_drain_begins();
    Py_ssize_t visited = ring_consume(&ring, visit, &state);
    drain_random = state.sink.random;
    freed_release();
    uint64_t freeing_ns = freed_drained(!started);
    tags_collect();
    release_target(&state);
    if (visited < 0) {
        return NULL;
    }
    return Py_BuildValue("(nLLK)", state.records, state.added, state.dropped,
                         (unsigned long long)freeing_ns);
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))native_start, METH_VARARGS | METH_KEYWORDS,
     "start(mode, interval, max_depth, lineno, markers, ring_bytes=1MiB): starts the engine. "
     "markers: the frame ids of [truncated], [waiting], [unknown], and a tuple naming each "
     "wait reason (None for unknown)."},
    {"stop", native_stop, METH_NOARGS, "Stops sampling; records taken stay for a last drain."},
    {"release", native_release, METH_NOARGS,
     "After stop and a last drain: unwatches deallocs and forgets the cached names."},
    {"after_fork_child", native_after_fork_child, METH_NOARGS,
     "In a forked child: forgets the parent's threads, timers and records, and stops."},
    {"register_current_thread", native_register_current_thread, METH_NOARGS,
     "Samples the calling thread from now on."},
    {"sync_threads", native_sync_threads, METH_O,
     "Samples every Python thread but the given set of idents; returns the live threads' idents."},
    {"pause_thread", native_pause_thread, METH_VARARGS,
     "pause_thread(ident, paused): stops or resumes sampling one thread."},
    {"set_interval", native_set_interval, METH_O, "Sets the sampling interval in seconds."},
    {"pause_all", native_pause_all, METH_O,
     "pause_all(paused): stops or restarts sampling every thread (while a tracer is attached)."},
    {"drain", native_drain, METH_VARARGS,
     "drain(resolve, target) -> (records, samples added, samples dropped, CPU nanoseconds "
     "spent freeing the host's code objects kept for the drain)"},
    {"tracer_pid", native_tracer_pid, METH_NOARGS,
     "The pid of the process tracing this one's main thread, or 0."},
    {"handler_ns", native_handler_ns, METH_NOARGS, "Nanoseconds spent in handlers so far."},
    {"hide_code", native_hide_code, METH_O,
     "hide_code(code): frames of this code object are left out of every walk (False: too many)."},
    {"wait_reason", native_wait_reason, METH_O,
     "wait_reason(tid): what thread tid is blocked in, an index of sampler._waits.REASONS."},
    {"gil_wait", native_gil_wait, METH_VARARGS,
     "gil_wait(seconds, threshold, own=None): sleeps without the GIL; returns how long taking "
     "it back took, the ident of the thread that held it, past threshold its seconds on a CPU "
     "meanwhile, and how many times the GIL passed to another thread. A thread of the set own "
     "(the sampler's) is let pass the GIL on before it is asked for."},
    {"watch_wake", native_watch_wake, METH_NOARGS,
     "watch_wake(): ends the stall watcher's sleep now (it is stopping, or a stall waits)."},
    {"watch_wait", (PyCFunction)(void (*)(void))native_watch_wait, METH_FASTCALL,
     "watch_wait(watcher, active, modules): gil_wait again and again until the stall watcher "
     "has work, or a second has passed; returns (threads, waited, holder, on_cpu, handoffs, "
     "now)."},
    {"handlers_are_ours", native_handlers_are_ours, METH_NOARGS,
     "Whether SIGPROF, SIGSEGV and SIGBUS are still handled by the engine."},
    {"tag_set", (PyCFunction)(void (*)(void))native_tag_set, METH_FASTCALL,
     "tag_set(frame_id, label_set): samples in that frame object carry the set from now on "
     "(-1: no tag); False when it could not be kept (counted as tags_lost)."},
    {"tags_load", native_tags_load, METH_O,
     "tags_load({frame_id: label_set}): the open tags are these, and no others."},
    {"tags_clear", native_tags_clear, METH_NOARGS, "Forgets every open tag."},
    {"stats", native_stats, METH_NOARGS, "The engine's counters."},
    {"count_requests", native_count_requests, METH_VARARGS,
     "count_requests(chunk, threshold, latency_bins, queue_bins, total_bins, scale, min_value, "
     "queue_delay, status_code, max_queue) -> (errors, queued, latency, queue, total, over): "
     "a route's finished requests into its sketches' bins (each sketch's zero, sum and max "
     "returned), and the indices of those slower than threshold."},
    {"number_functions", native_number_functions, METH_VARARGS,
     "number_functions(texts, separator, numbers, names) -> list of bytes: each folded stack's "
     "distinct frames, leaf first, as the numbers of ``numbers`` (name -> number; a name it "
     "lacks is numbered next and appended to ``names``), packed as array('i') holds them."},
    {"file_functions", native_file_functions, METH_VARARGS,
     "file_functions(stacks, first, functions) -> (holding, ending): for arrays('i') of "
     "function numbers, the ordinals (first, first + 1, ...) of the stacks holding each "
     "function, and of those whose first number it is, as {number: packed ordinals}."},
    {"asgi_request_start", native_asgi_request_start, METH_O,
     "asgi_request_start(headers): the value of an ASGI scope's first X-Request-Start or "
     "X-Queue-Start header, decoded as Latin-1, or None."},
    {"asgi_mark", native_asgi_mark, METH_O,
     "asgi_mark(marks): sets each name of the dict marks on StatusSend (asyncio's and "
     "inspect's markers of a callable that returns an awaitable)."},
    {"labels_bind", native_labels_bind, METH_VARARGS,
     "labels_bind(labels_var, frame_tags, route_sets, route_set_new): sampler._labels' "
     "state, for RouteTag and WSGIWrapper."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sampler._native",
    "fleetflame's native sampling engine (CPython 3.11, Linux).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "FLAG_TRUNCATED", FLAG_TRUNCATED) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_WAITING", FLAG_WAITING) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_REPEAT", FLAG_REPEAT) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_ENTRY", FLAG_ENTRY) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_EXIT", FLAG_EXIT) < 0 ||
        middleware_add_types(module) < 0 || asgi_add_types(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
