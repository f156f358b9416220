/* The stall watcher's question (sampler/_stalls.py): while it waited for the GIL, who held
 * it, did that thread run, and did the GIL change hands meanwhile.
 *
 * Thread states are listed by known_threads, under the runtime's head lock. The GIL's own
 * fields are read without any lock: its holder's address is compared with the states listed
 * before the sleep, never followed, and checked again once the GIL is back.
 *
 * Between the watcher's wakes, the engine's ticks look too (gil_alarm_tick): a thread that
 * holds the GIL on a CPU while another has waited a switch interval for it gets the ticks, and
 * the first tick that sees it wakes the watcher, whose wait then counts from that tick.
 */
#include "native.h"
#include "module.h"

#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct _gil_runtime_state *gil(void)
{
    return &_PyRuntime.ceval.gil;
}

static unsigned long switches(void)
{
    /* Counted by take_gil under the GIL's mutex; a torn read is impossible for an aligned
     * word, a stale one only makes a handoff look one fewer. */
    return *(volatile unsigned long *)&gil()->switch_number;
}

static int cpu_ns(pid_t tid, uint64_t *ns)
{
    struct timespec now;
    if (tid <= 0 || clock_gettime(thread_cpu_clock(tid), &now) != 0) {
        return -1;
    }
    *ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    return 0;
}

/* The idents in ``own`` (any iterable of ints), as many as fit; a wrong item is skipped. */
static void read_own(gil_watch *watch, PyObject *own)
{
    PyObject *items = own == NULL ? NULL : PyObject_GetIter(own);
    PyObject *item;
    while (items != NULL && watch->own_count < GIL_WATCH_OWN && (item = PyIter_Next(items))) {
        unsigned long ident = PyLong_AsUnsignedLong(item);
        Py_DECREF(item);
        if (ident == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            continue;
        }
        watch->own[watch->own_count++] = ident;
    }
    Py_XDECREF(items);
    PyErr_Clear(); /* the watcher never fails for it: its own threads are only not told apart */
}

void gil_watch_begin(gil_watch *watch, PyObject *own)
{
    memset(watch, 0, sizeof(*watch));
    watch->self = PyThreadState_Get();
    watch->threads = known_threads(&watch->count, 1); /* out of memory: none is named */
    read_own(watch, own);
}

static int held_by_own(const gil_watch *watch)
{
    for (int i = 0; watch->holder != NULL && i < watch->own_count; i++) {
        if (watch->own[i] == watch->holder->ident) {
            return 1;
        }
    }
    return 0;
}

static void read_holder_cpu(gil_watch *watch)
{
    watch->cpu_known = cpu_ns(watch->holder->tid, &watch->cpu_before) == 0;
}

void gil_watch_woke(gil_watch *watch)
{
    struct _gil_runtime_state *state = gil();
    watch->holder = NULL;
    watch->cpu_known = 0;
    if (!_Py_atomic_load_relaxed(&state->locked)) {
        return;
    }
    void *holder = (void *)_Py_atomic_load_relaxed(&state->last_holder);
    watch->switches = switches();
    /* Never the watcher's own state: between locked and last_holder, it is "the holder". */
    for (Py_ssize_t i = 0; holder != NULL && holder != watch->self && i < watch->count; i++) {
        if (watch->threads[i].state == holder) {
            watch->holder = &watch->threads[i];
            if (!held_by_own(watch)) { /* ours: read once the reading again is over */
                read_holder_cpu(watch);
            }
            return;
        }
    }
}

/* How often the GIL is read while the sampler's own thread holds it, and how long at most:
 * two switch intervals, when a thread waiting for the GIL makes the holder drop it. */
#define PASS_POLL_NS 200000L
#define PASS_MIN_NS 1000000ull
#define PASS_MAX_NS 20000000ull

uint64_t gil_watch_pass_own(gil_watch *watch, uint64_t woke)
{
    if (!held_by_own(watch)) {
        return woke;
    }
    /* The drain thread holding the GIL for a moment as the watcher wakes, and a host thread
     * taking it from the drain and keeping it: asked for the GIL at once, the watcher names
     * the drain (it held it as the watcher asked). So the watcher lets the drain finish: it
     * reads the holder again until another thread has the GIL, or no one wants it. */
    uint64_t wait = 2000ull * gil()->interval; /* microseconds */
    wait = wait < PASS_MIN_NS ? PASS_MIN_NS : wait > PASS_MAX_NS ? PASS_MAX_NS : wait;
    uint64_t now = monotonic_ns(), until = now + wait;
    int free_reads = 0;
    while (now < until) {
        struct timespec pause = {0, PASS_POLL_NS};
        nanosleep(&pause, NULL);
        gil_watch_woke(watch);
        now = monotonic_ns();
        if (watch->holder == NULL) {
            /* Free (another thread may be about to take it: read it twice more), or held by
             * a thread not listed before the sleep, which cannot be named anyway. */
            if (!_Py_atomic_load_relaxed(&gil()->locked) && ++free_reads < 3) {
                continue;
            }
            return now;
        }
        if (!held_by_own(watch)) {
            return now;
        }
        free_reads = 0;
    }
    if (watch->holder != NULL) { /* ours still holds it: named, its CPU read from now */
        read_holder_cpu(watch);
    }
    return now;
}

/* Forgets the holder if its address now holds another thread's state (the holder ended and
 * a new thread took its memory, or a new one still carries its parent's ids). */
static void confirm(gil_watch *watch)
{
    Py_ssize_t count;
    known_thread *now = known_threads(&count, 1);
    known_thread *holder = watch->holder;
    for (Py_ssize_t i = 0; now != NULL && i < count; i++) {
        if (now[i].state == holder->state &&
            (now[i].ident != holder->ident || now[i].tid != holder->tid)) {
            watch->holder = NULL;
            break;
        }
    }
    free(now);
}

void gil_watch_end(gil_watch *watch, int long_enough)
{
    if (watch->holder != NULL) {
        /* The watcher's own take is one switch; any more, and others held it meanwhile. */
        unsigned long taken = switches() - watch->switches;
        watch->handoffs = taken > 1 ? (long)(taken - 1) : 0;
        confirm(watch);
    }
    uint64_t after;
    watch->cpu_known = watch->holder != NULL && watch->cpu_known && long_enough &&
                       cpu_ns(watch->holder->tid, &after) == 0 && after >= watch->cpu_before;
    if (watch->cpu_known) {
        watch->cpu_ns = after - watch->cpu_before;
    }
}

void gil_watch_release(gil_watch *watch)
{
    free(watch->threads);
    watch->threads = NULL;
}

/* -- a hold seen by a tick ------------------------------------------------------------------ */

enum { ALARM_NONE, ALARM_AWAKE, ALARM_ASLEEP };
static sem_t alarm_sem;
static atomic_int alarm_state; /* ALARM_NONE until the semaphore exists */
/* What the first tick of a sleep saw: when (0: nothing yet), who held the GIL, its switches. */
static _Atomic uint64_t alarm_ns;
static _Atomic uintptr_t alarm_holder;
static _Atomic unsigned long alarm_switches;
static _Atomic uint64_t alarm_cpu; /* the holder's CPU clock at that tick (0: not read) */
static pthread_once_t alarm_once = PTHREAD_ONCE_INIT;

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the signal handler needs lock-free 64-bit atomics");

static void alarm_init(void)
{
    if (sem_init(&alarm_sem, 0, 0) == 0) {
        atomic_store(&alarm_state, ALARM_AWAKE);
    }
}

void gil_alarm_tick(PyThreadState *tstate)
{
    if (atomic_load_explicit(&alarm_state, memory_order_acquire) != ALARM_ASLEEP) {
        return;
    }
    struct _gil_runtime_state *state = gil();
    if (!_Py_atomic_load_relaxed(&state->locked) ||
        (PyThreadState *)_Py_atomic_load_relaxed(&state->last_holder) != tstate ||
        !_Py_atomic_load_relaxed(&tstate->interp->ceval.gil_drop_request)) {
        return;
    }
    uint64_t none = 0;
    if (atomic_compare_exchange_strong(&alarm_ns, &none, monotonic_ns())) {
        struct timespec cpu; /* the handler runs on the holder: its own clock */
        int read = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0;
        atomic_store(&alarm_cpu, read ? (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec
                                      : 0);
        atomic_store(&alarm_holder, (uintptr_t)tstate);
        atomic_store(&alarm_switches, switches());
        sem_post(&alarm_sem); /* async-signal-safe */
    }
}

void gil_alarm_wake(void)
{
    if (atomic_load(&alarm_state) != ALARM_NONE) {
        sem_post(&alarm_sem);
    }
}

static void sleep_through(double seconds)
{
    struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
}

/* The semaphore's wait up to ``seconds`` from now: on the monotonic clock where glibc has
 * sem_clockwait (2.30 on), else on the real-time clock (a clock step moves the wake). */
static void wait_posted(double seconds)
{
    struct timespec until;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    clockid_t clock = CLOCK_MONOTONIC;
#else
    clockid_t clock = CLOCK_REALTIME;
#endif
    clock_gettime(clock, &until);
    until.tv_sec += (time_t)seconds;
    until.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    while (sem_clockwait(&alarm_sem, clock, &until) != 0 && errno == EINTR) {
    }
#else
    while (sem_timedwait(&alarm_sem, &until) != 0 && errno == EINTR) {
    }
#endif
}

void gil_alarm_sleep(double seconds, gil_alarm *seen)
{
    memset(seen, 0, sizeof(*seen));
    pthread_once(&alarm_once, alarm_init);
    if (atomic_load(&alarm_state) == ALARM_NONE) {
        sleep_through(seconds);
        return;
    }
    /* A post left from before (a hold seen while it was awake, a late tick, a wake asked
     * for) only ends this sleep early: what it saw is told apart by its time. */
    atomic_store(&alarm_ns, 0);
    atomic_store(&alarm_holder, 0);
    uint64_t slept_from = monotonic_ns();
    atomic_store_explicit(&alarm_state, ALARM_ASLEEP, memory_order_release);
    wait_posted(seconds);
    atomic_store(&alarm_state, ALARM_AWAKE);
    uint64_t at = atomic_exchange(&alarm_ns, 0);
    if (at >= slept_from) { /* not a tick that read the state before, and the clock after */
        seen->at = at;
        seen->holder = (void *)atomic_load(&alarm_holder);
        seen->switches = atomic_load(&alarm_switches);
        seen->cpu = atomic_load(&alarm_cpu);
    }
}

PyObject *native_watch_wake(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    gil_alarm_wake();
    Py_RETURN_NONE;
}

/* Sleeps ``seconds`` without the GIL, then takes it back. Returns how long taking it back
 * took (a thread holding the GIL that long kept every other from running Python), and, about
 * the thread that held it as this one asked for it back: its ident (None if none did, or it
 * cannot be told: started during the sleep, or its state reused), its seconds on a CPU over
 * the wait if that lasted ``threshold`` seconds or more (None where its clock could not be
 * read: it has ended), and how many times the GIL passed to yet another thread meanwhile.
 * ``own``: idents of the sampler's threads, which are let pass the GIL on before it is asked
 * for (see gil_watch_pass_own). */
PyObject *native_gil_wait(PyObject *module, PyObject *args)
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
