/* The stall watcher's question (sampler/_stalls.py): while it waited for the GIL, who held
 * it, did that thread run, and did the GIL change hands meanwhile.
 *
 * Thread states are read only under the runtime's head lock and holding the GIL (states come
 * and go with or without the GIL: PyGILState_Ensure makes one before taking it). The GIL's
 * own fields are read without either: its holder's address is compared with the states
 * recorded before the sleep, never followed, and checked again once the GIL is back.
 */
#include "native.h"

#include "internal/pycore_runtime.h"

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
    /* The kernel's encoding of a thread's CPU clock (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED). */
    struct timespec now;
    if (tid <= 0 || clock_gettime((clockid_t)((~(unsigned int)tid << 3) | 6u), &now) != 0) {
        return -1;
    }
    *ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    return 0;
}

/* Calls ``visit`` on every thread state of every interpreter, under the head lock. */
static void each_state(void (*visit)(PyThreadState *, void *), void *context)
{
    PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
    for (PyInterpreterState *interp = PyInterpreterState_Head(); interp != NULL;
         interp = PyInterpreterState_Next(interp)) {
        for (PyThreadState *state = PyInterpreterState_ThreadHead(interp); state != NULL;
             state = PyThreadState_Next(state)) {
            visit(state, context);
        }
    }
    PyThread_release_lock(_PyRuntime.interpreters.mutex);
}

static void record(PyThreadState *state, void *context)
{
    gil_watch *watch = context;
    if (state == watch->self) {
        return; /* the watcher's own state: between locked and last_holder, it is "the holder" */
    }
    if (watch->count == watch->capacity) {
        Py_ssize_t capacity = watch->capacity ? 2 * watch->capacity : 64;
        known_thread *grown = realloc(watch->threads, (size_t)capacity * sizeof(known_thread));
        if (grown == NULL) {
            return;
        }
        watch->threads = grown;
        watch->capacity = capacity;
    }
    watch->threads[watch->count++] =
        (known_thread){state, state->thread_id, (pid_t)state->native_thread_id};
}

void gil_watch_begin(gil_watch *watch)
{
    memset(watch, 0, sizeof(*watch));
    watch->self = PyThreadState_Get();
    each_state(record, watch); /* out of memory: fewer threads known, none named */
}

void gil_watch_woke(gil_watch *watch)
{
    struct _gil_runtime_state *state = gil();
    if (!_Py_atomic_load_relaxed(&state->locked)) {
        return;
    }
    void *holder = (void *)_Py_atomic_load_relaxed(&state->last_holder);
    watch->switches = switches();
    for (Py_ssize_t i = 0; holder != NULL && i < watch->count; i++) {
        if (watch->threads[i].state == holder) {
            watch->holder = &watch->threads[i];
            watch->cpu_known = cpu_ns(watch->holder->tid, &watch->cpu_before) == 0;
            return;
        }
    }
}

static void confirm(PyThreadState *state, void *context)
{
    gil_watch *watch = context;
    known_thread *holder = watch->holder;
    if (holder != NULL && (void *)state == holder->state &&
        (state->thread_id != holder->ident || (pid_t)state->native_thread_id != holder->tid)) {
        /* Another thread's state at the same address (the holder ended, a new thread took
         * its memory), or one not yet started that still carries its parent's ids. */
        watch->holder = NULL;
    }
}

void gil_watch_end(gil_watch *watch, int long_enough)
{
    if (watch->holder != NULL) {
        /* The watcher's own take is one switch; any more, and others held it meanwhile. */
        unsigned long taken = switches() - watch->switches;
        watch->handoffs = taken > 1 ? (long)(taken - 1) : 0;
        each_state(confirm, watch);
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
