/* Which threads are sampled, and what makes them tick.
 *
 * cpu mode: every Python thread gets a POSIX timer on its own CPU clock that sends SIGPROF to
 * that thread (SIGEV_THREAD_ID). A thread that waits uses no CPU and gets no signal; a busy
 * one is interrupted where it is. The first expiry falls at a random point of the first
 * interval, so a thread that lives less than an interval is sampled with the right
 * probability. The kernel notices an expiry only at a scheduler tick that finds the thread
 * running (4 ms here): a thread registered on itself counts, when it ends, the expiries no
 * tick noticed, so a short thread's CPU is not lost.
 *
 * wall mode: a native thread ticks every interval and reads each thread's CPU clock. A thread
 * that ran (for a fifth of the interval or more) gets a signal and samples itself, as in cpu
 * mode; one that waited is read from here, holding the GIL (so its frames cannot move), and
 * marked waiting; one that has not run at all since it was last read waiting is where it was,
 * and counts again there without a walk.
 */
#include "native.h"

#include "internal/pycore_runtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A slot per sampled thread, from a fixed pool that is never freed: a timer's signal carries
 * its slot's address, and one still pending when the slot is given up must find memory that
 * is still a slot. */
typedef struct {
    int in_use;
    unsigned long ident; /* pthread_t */
    pid_t tid;
    timer_t timer;
    int has_timer;
    int paused;
    int seen;            /* found by the latest sync */
    /* cpu mode: the timer's expiries fall at arm_cpu + phase + k * period of the thread's
     * CPU clock; fired counts those signalled. At exit the difference is what the kernel had
     * no tick to notice. */
    uint64_t arm_cpu_ns, phase_ns, period_ns;
    _Atomic uint64_t fired;
    /* wall mode */
    uint64_t cpu_ns;     /* its CPU clock at the last tick, 0 before the first */
    int wait_known;      /* its last record was a waiting walk and it has not run since */
    uint64_t repeat;     /* intervals spent waiting there, not yet written */
    uint64_t credited;   /* intervals already counted ahead of the ticks (walk_waiting) */
} slot_t;

#define MAX_SLOTS 4096

static slot_t pool[MAX_SLOTS];
static slot_t *live[MAX_SLOTS]; /* the slots in use, in no particular order */
static Py_ssize_t slot_count;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t interval_ns = 10000000;
static uint64_t timer_failures;
static uint64_t random_state = 0x853c49e6748fea9bull;
static pthread_key_t exit_key;
static int exit_key_made;
static int all_paused; /* a tracer is attached: no signals at all (see threads_pause_all) */

#define REPEAT_FLUSH 16 /* intervals of waiting kept back before they are written */

clockid_t thread_cpu_clock(pid_t tid)
{
    /* The kernel's encoding of a thread's CPU clock (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED), as
     * glibc's pthread_getcpuclockid builds it, from the kernel thread id. */
    return (clockid_t)((~(unsigned int)tid << 3) | 6u);
}

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec now;
    if (clock_gettime(clock, &now) != 0) {
        return 0;
    }
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static struct timespec timespec_of(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    return ts;
}

static uint64_t next_random(void)
{
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    return random_state;
}

uint64_t threads_count_fired(void *slot_address, uint64_t expiries, unsigned long self)
{
    slot_t *slot = slot_address;
    if (slot < pool || slot >= pool + MAX_SLOTS) {
        return 0; /* not one of ours */
    }
    if (slot->ident == self) {
        atomic_fetch_add_explicit(&slot->fired, expiries, memory_order_relaxed);
    }
    return expiries;
}

static int set_timer(slot_t *slot)
{
    struct itimerspec spec;
    memset(&spec, 0, sizeof(spec));
    if (!slot->paused && !all_paused) {
        /* The first expiry at a random point of the first interval: a thread that lives less
         * than an interval is sampled with the right probability. */
        slot->period_ns = interval_ns;
        slot->phase_ns = 1 + next_random() % interval_ns;
        slot->arm_cpu_ns = clock_ns(thread_cpu_clock(slot->tid));
        atomic_store(&slot->fired, 0);
        spec.it_interval = timespec_of(slot->period_ns);
        spec.it_value = timespec_of(slot->phase_ns);
    }
    return timer_settime(slot->timer, 0, &spec, NULL);
}

/* set_timer for a thread that may have ended since the last sync (one the sync registered,
 * or one that existed before the start, has no exit hook): its CPU-clock timer has no thread
 * to count any more (ESRCH), which is no failure; the sync drops its slot. */
static int reset_timer(slot_t *slot)
{
    if (set_timer(slot) != 0 && errno != ESRCH) {
        return -1;
    }
    return 0;
}

static int create_timer(slot_t *slot)
{
    struct sigevent event;
    memset(&event, 0, sizeof(event));
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGPROF;
    event.sigev_value.sival_ptr = slot;
    event._sigev_un._tid = slot->tid; /* sigev_notify_thread_id, which glibc 2.36 does not name */
    if (timer_create(thread_cpu_clock(slot->tid), &event, &slot->timer) != 0) {
        timer_failures++;
        return -1;
    }
    slot->has_timer = 1;
    if (set_timer(slot) != 0) {
        timer_delete(slot->timer);
        slot->has_timer = 0;
        timer_failures++;
        return -1;
    }
    return 0;
}

static Py_ssize_t find(unsigned long ident)
{
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        if (live[i]->ident == ident) {
            return i;
        }
    }
    return -1;
}

static void drop(Py_ssize_t index)
{
    slot_t *slot = live[index];
    if (slot->has_timer) {
        timer_delete(slot->timer);
    }
    if (slot->repeat) {
        record_repeat(slot->repeat, slot->ident);
    }
    slot->ident = 0;
    slot->in_use = 0;
    live[index] = live[--slot_count];
}

static int add_locked(unsigned long ident, pid_t tid)
{
    Py_ssize_t existing = find(ident);
    if (existing >= 0) {
        live[existing]->seen = 1;
        return 0;
    }
    slot_t *slot = NULL;
    for (Py_ssize_t i = 0; i < MAX_SLOTS && slot == NULL; i++) {
        if (!pool[i].in_use) {
            slot = &pool[i];
        }
    }
    if (slot == NULL) {
        timer_failures++;
        return -1;
    }
    memset(slot, 0, sizeof(*slot));
    slot->ident = ident;
    slot->tid = tid;
    slot->seen = 1;
    if (!engine_wall && create_timer(slot) != 0) {
        slot->ident = 0;
        return -1;
    }
    slot->in_use = 1;
    live[slot_count++] = slot;
    return 0;
}

/* A registered thread ends (a pthread key destructor, on that thread): it counts the expiries
 * that fell after the last scheduler tick that could have noticed them. */
static void on_thread_exit(void *unused)
{
    (void)unused;
    unsigned long self = (unsigned long)pthread_self();
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = find(self);
    if (index >= 0) {
        slot_t *slot = live[index];
        if (slot->has_timer && !slot->paused && !all_paused && atomic_load(&engine_active)) {
            /* A clock below the one the timer was armed at is another thread's arming (an
             * ident reused before the last one's slot was dropped): nothing is due then,
             * rather than an unsigned wrap counting ~2^64 ns. */
            uint64_t now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            uint64_t used = now >= slot->arm_cpu_ns ? now - slot->arm_cpu_ns : 0;
            uint64_t due = used >= slot->phase_ns ? (used - slot->phase_ns) / slot->period_ns + 1 : 0;
            uint64_t fired = atomic_load(&slot->fired);
            if (due > fired) {
                record_exit(due - fired, self);
            }
        }
        drop(index);
    }
    pthread_mutex_unlock(&slots_lock);
}

int threads_add(unsigned long ident, pid_t tid)
{
    pthread_mutex_lock(&slots_lock);
    int result = add_locked(ident, tid);
    pthread_mutex_unlock(&slots_lock);
    return result;
}

int threads_add_current(void)
{
    int result = threads_add((unsigned long)pthread_self(), (pid_t)syscall(SYS_gettid));
    if (result == 0 && exit_key_made) {
        pthread_setspecific(exit_key, (void *)1);
    }
    return result;
}

void threads_remove(unsigned long ident)
{
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = find(ident);
    if (index >= 0) {
        drop(index);
    }
    pthread_mutex_unlock(&slots_lock);
}

int threads_pause(unsigned long ident, int paused)
{
    int result = 0;
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = find(ident);
    if (index >= 0 && live[index]->paused != paused) {
        slot_t *slot = live[index];
        slot->paused = paused;
        slot->cpu_ns = 0; /* wall mode: its time while paused is not counted */
        slot->wait_known = 0;
        if (slot->has_timer) {
            result = reset_timer(slot);
        }
    }
    pthread_mutex_unlock(&slots_lock);
    return result;
}

known_thread *known_threads(Py_ssize_t *count, int every_interpreter)
{
    Py_ssize_t capacity = 64, n = 0;
    known_thread *known = malloc((size_t)capacity * sizeof(known_thread));
    if (known == NULL) {
        return NULL;
    }
    PyInterpreterState *main = PyInterpreterState_Main();
    PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
    for (PyInterpreterState *interp = every_interpreter ? PyInterpreterState_Head() : main;
         interp != NULL; interp = every_interpreter ? PyInterpreterState_Next(interp) : NULL) {
        for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t;
             t = PyThreadState_Next(t)) {
            if (n == capacity) {
                known_thread *grown = realloc(known, (size_t)(2 * capacity) * sizeof(*known));
                if (grown == NULL) {
                    break;
                }
                known = grown;
                capacity *= 2;
            }
            known[n++] = (known_thread){t, t->thread_id, (pid_t)t->native_thread_id};
        }
    }
    PyThread_release_lock(_PyRuntime.interpreters.mutex);
    *count = n;
    return known;
}

PyObject *threads_sync(PyObject *excluded)
{
    Py_ssize_t count;
    known_thread *pairs = known_threads(&count, 0);
    if (pairs == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *alive = PySet_New(NULL);
    if (alive == NULL) {
        free(pairs);
        return NULL;
    }
    unsigned long own = wall_ident();
    pthread_mutex_lock(&slots_lock);
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        live[i]->seen = 0;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyLong_FromUnsignedLong(pairs[i].ident);
        if (key != NULL && PySet_Add(alive, key) != 0) {
            PyErr_Clear();
        }
        if (pairs[i].ident == own || pairs[i].tid <= 0) {
            Py_XDECREF(key);
            continue;
        }
        int skip = key == NULL ? -1 : PySet_Contains(excluded, key);
        Py_XDECREF(key);
        if (skip < 0) {
            PyErr_Clear();
            continue;
        }
        if (!skip) {
            add_locked(pairs[i].ident, pairs[i].tid);
        }
    }
    for (Py_ssize_t i = slot_count - 1; i >= 0; i--) {
        if (!live[i]->seen) {
            drop(i);
        }
    }
    pthread_mutex_unlock(&slots_lock);
    free(pairs);
    return alive;
}

int threads_set_interval(uint64_t ns)
{
    int result = 0;
    pthread_mutex_lock(&slots_lock);
    interval_ns = ns;
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        if (live[i]->has_timer && reset_timer(live[i]) != 0) {
            result = -1;
        }
    }
    pthread_mutex_unlock(&slots_lock);
    return result;
}

int threads_pause_all(int paused)
{
    int result = 0;
    pthread_mutex_lock(&slots_lock);
    if (all_paused != paused) {
        all_paused = paused;
        for (Py_ssize_t i = 0; i < slot_count; i++) {
            live[i]->cpu_ns = 0;
            live[i]->wait_known = 0;
            if (live[i]->has_timer && reset_timer(live[i]) != 0) {
                result = -1;
            }
        }
    }
    pthread_mutex_unlock(&slots_lock);
    return result;
}

uint64_t threads_interval_ns(void)
{
    return interval_ns;
}

void threads_clear(void)
{
    pthread_mutex_lock(&slots_lock);
    while (slot_count > 0) {
        drop(slot_count - 1);
    }
    pthread_mutex_unlock(&slots_lock);
}

Py_ssize_t threads_count(void)
{
    return slot_count;
}

uint64_t threads_timer_failures(void)
{
    return timer_failures;
}

int threads_init(void)
{
    random_state ^= monotonic_ns() | 1;
    if (!exit_key_made && pthread_key_create(&exit_key, on_thread_exit) == 0) {
        exit_key_made = 1;
    }
    return 0;
}

void threads_flush_repeats(void)
{
    pthread_mutex_lock(&slots_lock);
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        if (live[i]->repeat) {
            record_repeat(live[i]->repeat, live[i]->ident);
            live[i]->repeat = 0;
        }
    }
    pthread_mutex_unlock(&slots_lock);
}

/* -- the wall thread ------------------------------------------------------------------------ */

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
        Py_ssize_t index = walks[i].tid ? find(walks[i].ident) : -1;
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

void threads_after_fork(void)
{
    /* Only the forking thread lives on in the child, and POSIX timers are not inherited:
     * forget every slot (deleting their timer ids could delete the child's own) and the wall
     * thread. */
    pthread_mutex_init(&slots_lock, NULL);
    pthread_mutex_init(&wall_lock, NULL);
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        live[i]->in_use = 0;
        live[i]->ident = 0;
    }
    slot_count = 0;
    all_paused = 0;
    wall_started = 0;
    atomic_store(&wall_running, 0);
    atomic_store(&wall_thread_ident, 0);
    wall_tstate = NULL;
}
