/* The engine's Python face: starting and stopping it, the threads it samples, its interval,
 * and the code objects its walks leave out. Everything here is called holding the GIL.
 */
#include "native.h"
#include "module.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEPTH 4096
#define MIN_INTERVAL 1e-4 /* seconds */
#define MAX_INTERVAL 3600.0

int engine_started;

static int valid_interval(double interval)
{
    return isfinite(interval) && interval >= MIN_INTERVAL && interval <= MAX_INTERVAL;
}

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

PyObject *native_start(PyObject *module, PyObject *args, PyObject *kwargs)
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
    if (engine_started) {
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
    /* A process forked without PyOS_AfterFork_Child (uWSGI's workers without
     * py-call-osafterfork) keeps its parent's thread id in the thread state, and every timer
     * made for it failed (timer_create: EINVAL): correct it, as that function would have. */
    PyThreadState *current = PyThreadState_Get();
    pid_t tid = (pid_t)syscall(SYS_gettid);
    if ((pid_t)current->native_thread_id != tid) {
        current->native_thread_id = (unsigned long)tid;
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
    engine_started = 1;
    Py_RETURN_NONE;
}

PyObject *native_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (engine_started) {
        atomic_store(&engine_active, 0);
        wall_stop();
        threads_clear();
        engine_started = 0;
        wait_for_handlers();
    }
    Py_RETURN_NONE;
}

PyObject *native_release(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!engine_started) {
        freed_drained(1);
        freed_unwatch();
        codemap_clear();
    }
    Py_RETURN_NONE;
}

PyObject *native_after_fork_child(PyObject *module, PyObject *unused)
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
    engine_started = 0;
    Py_RETURN_NONE;
}

PyObject *native_register_current_thread(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!engine_started || threads_add_current() != 0) {
        Py_RETURN_FALSE;
    }
    /* Its stack now, the thread's entry: where its last CPU goes if it ends unsampled. */
    PyThreadState *tstate = PyThreadState_Get();
    record_stack(tstate, 0, FLAG_ENTRY, tstate->thread_id);
    Py_RETURN_TRUE;
}

PyObject *native_sync_threads(PyObject *module, PyObject *excluded)
{
    (void)module;
    if (!PyAnySet_Check(excluded)) {
        PyErr_SetString(PyExc_TypeError, "sync_threads() takes a set of thread idents");
        return NULL;
    }
    if (!engine_started) {
        return PySet_New(NULL);
    }
    return threads_sync(excluded);
}

PyObject *native_pause_thread(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned long ident;
    int paused;
    if (!PyArg_ParseTuple(args, "kp", &ident, &paused)) {
        return NULL;
    }
    if (engine_started && threads_pause(ident, paused) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyObject *native_pause_all(PyObject *module, PyObject *arg)
{
    (void)module;
    int paused = PyObject_IsTrue(arg);
    if (paused < 0) {
        return NULL;
    }
    if (engine_started && threads_pause_all(paused) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyObject *native_set_interval(PyObject *module, PyObject *arg)
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

PyObject *native_hide_code(PyObject *module, PyObject *code)
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
