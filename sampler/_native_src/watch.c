/* The stall watcher's loop between the moments it has work (sampler/_stalls.py).
 *
 * The watcher wakes to ask for the GIL back, timing how long that takes (gil.c): every period
 * while a timed call is near its limit, else as late as the calls running allow (sleep_for).
 * Most wakes find nothing to do: no hold past the threshold, no stall reported, no module
 * loaded, no call near its threshold. A wake of the Python loop cost ~70 us of a CPU on this
 * machine's slow days, half of it the interpreter's (40 a second: 0.3% of a CPU); this loop
 * keeps those wakes in C and returns to Python only when there is work, or once a second.
 */
#include "middleware.h"
#include "module.h"

#include <string.h>
#include <time.h>

#define QUIET_NS 1000000000ull /* Python's loop runs at least this often (its housekeeping) */
/* A timed call's stack is read from this long before its limit on, and then at every period
 * while it runs; until some call gets there the watcher sleeps longer than a period (below). */
#define LEAD 0.005
#define SHORTEST_SLEEP 0.001
#define IDLE_AFTER 1.0 /* seconds with no timed call begun: the watcher sleeps long (idle_sleep) */

double gil_wait_once(double seconds, double threshold, gil_watch *watch, PyObject *own)
{
    gil_watch_begin(watch, own);
    uint64_t from;
    Py_BEGIN_ALLOW_THREADS
    gil_alarm seen;
    gil_alarm_sleep(seconds, &seen);
    uint64_t woke = monotonic_ns();
    gil_watch_woke(watch);
    from = gil_watch_pass_own(watch, woke);
    /* Woken by a tick that saw this hold: the wait counts from that tick. Not if the GIL
     * changed hands since (the tick's hold is over, or the sampler's own thread held it as the
     * watcher woke: then from when another took it). */
    if (seen.at != 0 && seen.at < woke && from == woke && watch->holder != NULL &&
        watch->holder->state == seen.holder && watch->switches == seen.switches) {
        from = seen.at;
        if (watch->cpu_known && seen.cpu != 0 && seen.cpu <= watch->cpu_before) {
            watch->cpu_before = seen.cpu; /* its time on a CPU over the same wait */
        }
    }
    Py_END_ALLOW_THREADS
    uint64_t took = monotonic_ns() - from;
    gil_watch_end(watch, (double)took >= threshold * 1e9);
    return (double)took / 1e9;
}

PyObject *gil_wait_result(double waited, gil_watch *watch)
{
    if (watch->holder == NULL) {
        return Py_BuildValue("(dOOl)", waited, Py_None, Py_None, watch->handoffs);
    }
    if (!watch->cpu_known) {
        return Py_BuildValue("(dkOl)", waited, watch->holder->ident, Py_None, watch->handoffs);
    }
    return Py_BuildValue("(dkdl)", waited, watch->holder->ident, (double)watch->cpu_ns / 1e9,
                         watch->handoffs);
}

/* What the watcher (a sampler._stalls.StallWatcher) holds, read again at each wake: its
 * settings may change while it waits. */
typedef struct {
    double period, threshold, request_threshold;
    Py_ssize_t modules_seen;
    PyObject *running; /* the calls running: a RunningCalls, or the Python wrapper's dict */
    PyObject *pending; /* stalls reported, waiting for the Python loop */
    PyObject *stopping; /* a threading.Event */
    PyObject *own;      /* its sampler's own threads' idents (_sampler._excluded), or NULL */
} watched;

enum { PERIOD, THRESHOLD, REQUEST_THRESHOLD, MODULES_SEEN, RUNNING, PENDING, STOPPING, NAMES };
static const char *const attribute_names[NAMES] = {
    "period", "threshold", "request_threshold", "_modules_seen", "_running", "_pending",
    "_stopping",
};
static PyObject *attributes[NAMES], *request_kind, *flag_name, *sampler_name, *excluded_name;

static int intern_names(void)
{
    for (int i = 0; i < NAMES; i++) {
        if (attributes[i] == NULL &&
            (attributes[i] = PyUnicode_InternFromString(attribute_names[i])) == NULL) {
            return -1;
        }
    }
    if (request_kind == NULL && (request_kind = PyUnicode_InternFromString("request")) == NULL) {
        return -1;
    }
    if (flag_name == NULL && (flag_name = PyUnicode_InternFromString("_flag")) == NULL) {
        return -1;
    }
    if (sampler_name == NULL && (sampler_name = PyUnicode_InternFromString("_sampler")) == NULL) {
        return -1;
    }
    if (excluded_name == NULL &&
        (excluded_name = PyUnicode_InternFromString("_excluded")) == NULL) {
        return -1;
    }
    return 0;
}

static void release_watched(watched *w)
{
    Py_CLEAR(w->running);
    Py_CLEAR(w->pending);
    Py_CLEAR(w->stopping);
    Py_CLEAR(w->own);
}

/* The watcher's sampler's own threads, or NULL (a watcher without a sampler: no error). */
static PyObject *read_own(PyObject *watcher)
{
    PyObject *sampler = PyObject_GetAttr(watcher, sampler_name);
    PyObject *own = sampler == NULL ? NULL : PyObject_GetAttr(sampler, excluded_name);
    Py_XDECREF(sampler);
    if (own == NULL) {
        PyErr_Clear();
    }
    return own;
}

static int read_double(PyObject *watcher, int name, double *into)
{
    PyObject *value = PyObject_GetAttr(watcher, attributes[name]);
    *into = value == NULL ? -1.0 : PyFloat_AsDouble(value);
    Py_XDECREF(value);
    return *into == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* 0, or -1 with an exception set (what was read released). */
static int read_watched(PyObject *watcher, watched *w)
{
    memset(w, 0, sizeof(*w));
    PyObject *seen = NULL;
    if (read_double(watcher, PERIOD, &w->period) < 0 ||
        read_double(watcher, THRESHOLD, &w->threshold) < 0 ||
        read_double(watcher, REQUEST_THRESHOLD, &w->request_threshold) < 0 ||
        (seen = PyObject_GetAttr(watcher, attributes[MODULES_SEEN])) == NULL ||
        ((w->modules_seen = PyLong_AsSsize_t(seen)) == -1 && PyErr_Occurred()) ||
        (w->running = PyObject_GetAttr(watcher, attributes[RUNNING])) == NULL ||
        (w->pending = PyObject_GetAttr(watcher, attributes[PENDING])) == NULL ||
        (w->stopping = PyObject_GetAttr(watcher, attributes[STOPPING])) == NULL) {
        Py_XDECREF(seen);
        release_watched(w);
        return -1;
    }
    Py_DECREF(seen);
    w->own = read_own(watcher);
    if (!PyDict_Check(w->running) && !running_check(w->running)) {
        PyErr_SetString(PyExc_TypeError,
                        "watch_wait(): the watcher's _running is not a dict or RunningCalls");
        release_watched(w);
        return -1;
    }
    if (!(w->period >= 0 && w->period <= 10) || !(w->threshold >= 0)) {
        PyErr_SetString(PyExc_ValueError, "watch_wait() sleeps from 0 to 10 seconds");
        release_watched(w);
        return -1;
    }
    return 0;
}

static double lead(const watched *w)
{
    return w->period < LEAD ? w->period : LEAD;
}

/* Seconds from ``now`` until the call, (kind, monotonic start), has run its limit less the
 * lead (the watcher reads its stack from then on): 0 or less once it has; -1 with an exception
 * set, and a call of another shape is not ours to judge (Python's loop reads it): 0. */
static int call_reading_time(const watched *w, PyObject *call, double now, double *until)
{
    *until = 0;
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != 2) {
        return 0;
    }
    double started = PyFloat_AsDouble(PyTuple_GET_ITEM(call, 1));
    if (started == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *kind = PyTuple_GET_ITEM(call, 0);
    int is_request = kind == request_kind ? 1 : PyObject_RichCompareBool(kind, request_kind, Py_EQ);
    if (is_request < 0) {
        return -1;
    }
    *until = started + (is_request ? w->request_threshold : w->threshold) - lead(w) - now;
    return 0;
}

/* Seconds from ``now`` until the first timed call of the watcher's has run its limit less the
 * lead (0 or less when one has), at most ``longest``; -1 with an exception set. */
static int first_reading_time(const watched *w, double now, double longest, double *first)
{
    *first = longest;
    Py_ssize_t pos = 0;
    if (running_check(w->running)) { /* TimedCall's table: no object to read */
        unsigned long thread;
        int kind;
        double started;
        while (running_next(w->running, &pos, &thread, &kind, &started)) {
            double limit = kind == KIND_REQUEST ? w->request_threshold : w->threshold;
            double until = started + limit - lead(w) - now;
            if (until < *first) {
                *first = until;
            }
        }
        return 0;
    }
    PyObject *ident, *call;
    while (PyDict_Next(w->running, &pos, &ident, &call)) {
        /* Owned while read: a comparison that ran Python code could let another thread
         * replace the entry. */
        Py_INCREF(call);
        double until;
        int failed = call_reading_time(w, call, now, &until);
        Py_DECREF(call);
        if (failed) {
            return -1;
        }
        if (until < *first) {
            *first = until;
        }
        if (*first <= 0) {
            return 0;
        }
    }
    return 0;
}

/* How many of ``threads`` (threading's, by ident) are not the sampler's own; -1 on an error. */
static Py_ssize_t host_threads(const watched *w, PyObject *threads)
{
    Py_ssize_t pos = 0, count = 0;
    PyObject *ident, *thread;
    while (PyDict_Next(threads, &pos, &ident, &thread)) {
        int own = w->own != NULL && PyAnySet_Check(w->own) ? PySet_Contains(w->own, ident) : 0;
        if (own < 0) {
            PyErr_Clear();
            return -1;
        }
        count += !own;
    }
    return count;
}

/* With TimedCall's table, in a process whose host runs one thread: once no call has begun for
 * IDLE_AFTER and none runs, the watcher sleeps the rest of Python's second, and the next call
 * to begin wakes it (timed.c). An idle worker's watcher woke ~22 times a second to find
 * nothing. What those wakes alone find, a GIL hold no tick saw (its holder off the CPU:
 * blocked in a call that kept the GIL), needs another host thread waiting for the GIL: with
 * more than one, the watcher keeps its wakes. */
static void idle_sleep(const watched *w, PyObject *threads, double now, double quiet_left,
                       double *sleep)
{
    if (!running_check(w->running)) {
        return;
    }
    RunningCalls *running = (RunningCalls *)w->running;
    running->watcher_idle = 0;
    if (running->begun != running->watcher_seen || running->watcher_seen_at == 0) {
        running->watcher_seen = running->begun;
        running->watcher_seen_at = now;
        return;
    }
    Py_ssize_t pos = 0;
    unsigned long ident;
    int kind;
    double started;
    if (now - running->watcher_seen_at >= IDLE_AFTER && quiet_left > *sleep &&
        !running_next(w->running, &pos, &ident, &kind, &started) &&
        host_threads(w, threads) == 1) {
        *sleep = quiet_left;
        running->watcher_idle = 1;
    }
}

/* How long the watcher sleeps from ``now``: a period while a call is being read; else until
 * the first running call is to be read, and with none, the smallest limit less the lead (a
 * call that starts just after the sleep starts is then seen before it is to be read), but
 * never less than a period unless a call is to be read sooner, nor longer than ``quiet_left``
 * (Python's loop runs at least once a second, whatever the thresholds). A wake found nothing
 * to do ~40 times a second with a 25 ms period; ~22 with 45 ms sleeps, and waking is most of
 * the watcher's cost. -1 with an exception set. */
static int sleep_for(const watched *w, PyObject *threads, double now, double quiet_left,
                     double *sleep)
{
    double limit = w->threshold < w->request_threshold ? w->threshold : w->request_threshold;
    double longest = limit - lead(w) > w->period ? limit - lead(w) : w->period;
    if (!(longest <= quiet_left)) { /* large or infinite thresholds: Python's loop runs */
        longest = quiet_left;
    }
    double first;
    if (first_reading_time(w, now, longest, &first) < 0) {
        return -1;
    }
    *sleep = first <= 0 ? w->period : first;
    if (!(*sleep >= SHORTEST_SLEEP)) {
        *sleep = SHORTEST_SLEEP;
    }
    idle_sleep(w, threads, now, quiet_left, sleep);
    return 0;
}

/* 1 when a timed call of the watcher's has run its limit less the lead, 0 when none has, -1
 * with an exception set. */
static int call_near_limit(const watched *w, double now)
{
    double first;
    if (first_reading_time(w, now, 1.0, &first) < 0) {
        return -1;
    }
    return first <= 0;
}

/* Whether a threading.Event is set: its flag read as is_set() reads it (calling is_set() ran a
 * Python frame at each wake, a fifth of a wake's cost); -1 with an exception set. */
static int is_set(PyObject *event)
{
    PyObject *flag = PyObject_GetAttr(event, flag_name);
    if (flag == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear(); /* another Event than threading's: asked */
        flag = PyObject_CallMethod(event, "is_set", NULL);
    }
    int set = flag == NULL ? -1 : PyObject_IsTrue(flag);
    Py_XDECREF(flag);
    return set;
}

/* 1 when the watcher's Python loop has work after a wake, 0 when it has none, -1 with an
 * exception set. */
static int has_work(const watched *w, double waited, double now, PyObject *modules)
{
    if (waited > w->threshold) {
        return 1;
    }
    int stopped = is_set(w->stopping);
    if (stopped != 0) {
        return stopped;
    }
    Py_ssize_t count = PyObject_Length(w->pending);
    if (count != 0) {
        return count < 0 ? -1 : 1;
    }
    Py_ssize_t loaded = PyObject_Length(modules);
    if (loaded != w->modules_seen) {
        return loaded < 0 ? -1 : 1;
    }
    return call_near_limit(w, now);
}

/* watch_wait(watcher, active, modules)
 * Sleeps (sleep_for) and takes the GIL back as gil_wait does, again and again, until a wake
 * has work for the watcher's Python loop: a GIL hold past the threshold, its Event _stopping
 * set, a stall _pending, a module loaded (len(modules) is not its _modules_seen), a call of its
 * _running near its limit; or a second has passed. The watcher's attributes are read at each
 * wake. Returns (threads, waited, holder, on_cpu, handoffs, now): a copy of ``active``
 * (threading's threads) taken before that wake's sleep, gil_wait's four, and the monotonic
 * clock after it. */
PyObject *native_watch_wait(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "watch_wait(watcher, active: dict, modules)");
        return NULL;
    }
    if (intern_names() < 0) {
        return NULL;
    }
    PyObject *watcher = args[0], *active = args[1], *modules = args[2];
    uint64_t quiet_until = monotonic_ns() + QUIET_NS;
    for (;;) {
        watched w;
        if (read_watched(watcher, &w) < 0) {
            return NULL;
        }
        PyObject *threads = PyDict_Copy(active);
        if (threads == NULL) {
            release_watched(&w);
            return NULL;
        }
        double sleep;
        uint64_t before = monotonic_ns();
        double quiet_left = before < quiet_until ? (double)(quiet_until - before) / 1e9 : 0;
        if (sleep_for(&w, threads, (double)before / 1e9, quiet_left, &sleep) < 0) {
            Py_DECREF(threads);
            release_watched(&w);
            return NULL;
        }
        gil_watch watch;
        double waited = gil_wait_once(sleep, w.threshold, &watch, w.own);
        uint64_t now_ns = monotonic_ns();
        double now = (double)now_ns / 1e9;
        int work = now_ns >= quiet_until ? 1 : has_work(&w, waited, now, modules);
        PyObject *result = NULL, *held = NULL;
        if (work > 0 && (held = gil_wait_result(waited, &watch)) != NULL) {
            result = Py_BuildValue("(OdOOOd)", threads, waited, PyTuple_GET_ITEM(held, 1),
                                   PyTuple_GET_ITEM(held, 2), PyTuple_GET_ITEM(held, 3), now);
            Py_DECREF(held);
        }
        Py_DECREF(threads);
        gil_watch_release(&watch);
        release_watched(&w);
        if (work != 0) {
            return result; /* NULL with the exception set when work < 0 or building failed */
        }
    }
}
