/* What makes threads tick in wall mode: the wall thread.
 *
 * A native thread ticks every interval and reads each thread's CPU clock. A thread that ran
 * (for a fifth of the interval or more) gets a signal and samples itself, as in cpu mode; one
 * that waited is read from here, holding the GIL (so its frames cannot move), and marked
 * waiting; one that has not run at all since it was last read waiting is where it was, and
 * counts again there without a walk.
 */
#include "threads.h"

#include "internal/pycore_runtime.h"

#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define REPEAT_FLUSH 16 /* intervals of waiting kept back before they are written */

static pthread_t wall_thread;
static int wall_started;
static _Atomic int wall_running;
static _Atomic unsigned long wall_thread_ident;
static pthread_mutex_t wall_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wall_wake;
static PyThreadState *wall_tstate;

unsigned long wall_ident(void)
{
    return atomic_load(&wall_thread_ident);
}

static int signal_thread(pid_t tid, uint64_t weight, int reason, uint64_t on_cpu)
{
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    info.si_signo = SIGPROF;
    info.si_code = SI_QUEUE;
    info.si_pid = getpid();
    info.si_uid = getuid();
    info.si_value.sival_ptr = WALL_VALUE(weight > 0xffffffffu ? 0xffffffffu : weight, reason, on_cpu);
    return (int)syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGPROF, &info);
}

typedef struct {
    unsigned long ident;
    pid_t tid;
    int reason;
    uint64_t weight;   /* intervals since it was last counted */
    uint64_t cpu_ns;   /* its CPU clock at the tick */
    uint64_t credit;   /* intervals it waited, while the wall thread waited for the GIL */
} pending_walk;

/* Reads the threads that waited, holding the GIL: none of them can run Python meanwhile. What
 * each waits on is read first, without the GIL (a thread waiting for it is waiting).
 *
 * Taking the GIL can take long: C code that holds it (a sort, a regex) stops this thread
 * too. A thread that did not run meanwhile waited all that time where it is read now, so its
 * sample counts those intervals, which its next ticks then leave out (``credited``): counted
 * later, they would go wherever the thread has moved by then. */
static void walk_waiting(pending_walk *walks, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        walks[i].reason = wait_reason(walks[i].tid);
    }
    uint64_t asked = monotonic_ns();
    PyEval_RestoreThread(wall_tstate);
    uint64_t delay = (monotonic_ns() - asked) / interval_ns;
    for (Py_ssize_t i = 0; i < count; i++) {
        walks[i].credit = 0;
        if (delay > 0 && clock_ns(thread_cpu_clock(walks[i].tid)) == walks[i].cpu_ns) {
            walks[i].credit = delay;
        }
    }
    PyInterpreterState *interp = PyInterpreterState_Main();
    PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
    for (Py_ssize_t i = 0; i < count; i++) {
        for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) {
            if ((pid_t)t->native_thread_id == walks[i].tid && t->thread_id == walks[i].ident) {
                uint32_t flags = FLAG_WAITING | ((uint32_t)walks[i].reason << FLAG_REASON_SHIFT);
                if (record_stack(t, walks[i].weight + walks[i].credit, flags, t->thread_id) != 0) {
                    walks[i].tid = 0; /* not known: walk it again next time */
                }
                break;
            }
        }
    }
    PyThread_release_lock(_PyRuntime.interpreters.mutex);
    wall_tstate = PyEval_SaveThread();
    pthread_mutex_lock(&slots_lock);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t index = walks[i].tid ? slot_find(walks[i].ident) : -1;
        if (index >= 0) {
            live[index]->wait_known = 1;
            live[index]->credited += walks[i].credit;
        }
    }
    pthread_mutex_unlock(&slots_lock);
}

static void wall_tick(uint64_t all_ticks, pending_walk **walks, Py_ssize_t *walk_capacity)
{
    Py_ssize_t pending = 0;
    pthread_mutex_lock(&slots_lock);
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        slot_t *slot = live[i];
        struct timespec cpu;
        if (slot->paused || clock_gettime(thread_cpu_clock(slot->tid), &cpu) != 0) {
            continue; /* paused, or gone: the next sync drops it */
        }
        uint64_t ticks = all_ticks;
        if (slot->credited) {
            uint64_t counted = slot->credited < ticks ? slot->credited : ticks;
            slot->credited -= counted;
            ticks -= counted;
            if (ticks == 0) {
                continue; /* its CPU clock is read again next time */
            }
        }
        uint64_t elapsed = ticks * interval_ns;
        uint64_t now = (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec;
        /* A clock that went back is another thread's (a reused slot): take it as running. */
        uint64_t ran = slot->cpu_ns && now >= slot->cpu_ns ? now - slot->cpu_ns : elapsed;
        slot->cpu_ns = now ? now : 1;
        if (ran == 0 && slot->wait_known) {
            slot->repeat += ticks;
            if (slot->repeat >= REPEAT_FLUSH) {
                record_repeat(slot->repeat, slot->ident);
                slot->repeat = 0;
            }
            continue;
        }
        if (slot->repeat) {
            record_repeat(slot->repeat, slot->ident);
            slot->repeat = 0;
        }
        slot->wait_known = 0;
        if (5 * ran >= elapsed) {
            /* It ran, and waited for the rest: what it is blocked in now, if anything, is the
             * best guess of what it waited on (a thread waiting for a core is in none). */
            uint64_t on_cpu = ran >= elapsed ? 1000 : ran * 1000 / elapsed;
            int reason = on_cpu < 1000 ? wait_reason(slot->tid) : REASON_UNKNOWN;
            if (signal_thread(slot->tid, ticks, reason, on_cpu) != 0) {
                atomic_fetch_add(&stats.dropped, ticks); /* gone, or one still pending */
            }
        } else {
            if (pending == *walk_capacity) {
                Py_ssize_t capacity = 2 * *walk_capacity + 16;
                pending_walk *grown = realloc(*walks, (size_t)capacity * sizeof(pending_walk));
                if (grown == NULL) {
                    continue;
                }
                *walks = grown;
                *walk_capacity = capacity;
            }
            (*walks)[pending].ident = slot->ident;
            (*walks)[pending].tid = slot->tid;
            (*walks)[pending].cpu_ns = now;
            (*walks)[pending].weight = ticks;
            pending++;
        }
    }
    pthread_mutex_unlock(&slots_lock);
    if (pending) {
        walk_waiting(*walks, pending);
    }
}

static void *wall_main(void *unused)
{
    (void)unused;
    sigset_t blocked;
    sigfillset(&blocked);
    sigdelset(&blocked, SIGSEGV);
    sigdelset(&blocked, SIGBUS);
    pthread_sigmask(SIG_BLOCK, &blocked, NULL);

    PyGILState_STATE gil = PyGILState_Ensure();
    atomic_store(&wall_thread_ident, PyThreadState_Get()->thread_id);
    wall_tstate = PyEval_SaveThread();

    pending_walk *walks = NULL;
    Py_ssize_t walk_capacity = 0;
    uint64_t next = monotonic_ns();
    pthread_mutex_lock(&wall_lock);
    while (atomic_load(&wall_running)) {
        next += interval_ns;
        struct timespec until = timespec_of(next);
        while (atomic_load(&wall_running) &&
               pthread_cond_timedwait(&wall_wake, &wall_lock, &until) == 0) {
        }
        if (!atomic_load(&wall_running)) {
            break;
        }
        pthread_mutex_unlock(&wall_lock);
        uint64_t now = monotonic_ns(), ticks = 1;
        if (now > next + interval_ns) {
            ticks += (now - next) / interval_ns; /* late: the missed ticks count too */
            next += (ticks - 1) * interval_ns;
        }
        if (atomic_load_explicit(&engine_active, memory_order_acquire) && !all_paused) {
            wall_tick(ticks, &walks, &walk_capacity);
        }
        pthread_mutex_lock(&wall_lock);
    }
    pthread_mutex_unlock(&wall_lock);
    free(walks);
    PyEval_RestoreThread(wall_tstate);
    PyGILState_Release(gil);
    return NULL;
}

int wall_start(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&wall_wake, &attr);
    pthread_condattr_destroy(&attr);
    atomic_store(&wall_running, 1);
    if (pthread_create(&wall_thread, NULL, wall_main, NULL) != 0) {
        atomic_store(&wall_running, 0);
        return -1;
    }
    /* Known now, before any sync can see the thread's state and give it a slot. */
    atomic_store(&wall_thread_ident, (unsigned long)wall_thread);
    wall_started = 1;
    return 0;
}

/* Called holding the GIL; lets it go while the wall thread finishes (it may be waiting for
 * the GIL itself). */
void wall_stop(void)
{
    if (!wall_started) {
        return;
    }
    pthread_mutex_lock(&wall_lock);
    atomic_store(&wall_running, 0);
    pthread_cond_signal(&wall_wake);
    pthread_mutex_unlock(&wall_lock);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(wall_thread, NULL);
    Py_END_ALLOW_THREADS
    wall_started = 0;
    atomic_store(&wall_thread_ident, 0);
}

void wall_after_fork(void)
{
    pthread_mutex_init(&wall_lock, NULL);
    wall_started = 0;
    atomic_store(&wall_running, 0);
    atomic_store(&wall_thread_ident, 0);
    wall_tstate = NULL;
}
