/* What makes a thread tick in cpu mode: a timer on its own CPU clock, and its last expiries
 * counted when it ends.
 *
 * Every Python thread gets a POSIX timer on its own CPU clock that sends SIGPROF to that
 * thread (SIGEV_THREAD_ID). A thread that waits uses no CPU and gets no signal; a busy one is
 * interrupted where it is. The first expiry falls at a random point of the first interval, so
 * a thread that lives less than an interval is sampled with the right probability. The kernel
 * notices an expiry only at a scheduler tick that finds the thread running (4 ms here): a
 * thread registered on itself counts, when it ends, the expiries no tick noticed, so a short
 * thread's CPU is not lost.
 */
#include "threads.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t random_state = 0x853c49e6748fea9bull;
static pthread_key_t exit_key;
static int exit_key_made;

uint64_t clock_ns(clockid_t clock)
{
    struct timespec now;
    if (clock_gettime(clock, &now) != 0) {
        return 0;
    }
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

struct timespec timespec_of(uint64_t ns)
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
int reset_timer(slot_t *slot)
{
    if (set_timer(slot) != 0 && errno != ESRCH) {
        return -1;
    }
    return 0;
}

int create_timer(slot_t *slot)
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

/* A registered thread ends (a pthread key destructor, on that thread): it counts the expiries
 * that fell after the last scheduler tick that could have noticed them. */
static void on_thread_exit(void *unused)
{
    (void)unused;
    unsigned long self = (unsigned long)pthread_self();
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = slot_find(self);
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
        slot_drop(index);
    }
    pthread_mutex_unlock(&slots_lock);
}

int threads_add_current(void)
{
    int result = threads_add((unsigned long)pthread_self(), (pid_t)syscall(SYS_gettid));
    if (result == 0 && exit_key_made) {
        pthread_setspecific(exit_key, (void *)1);
    }
    return result;
}

int threads_init(void)
{
    random_state ^= monotonic_ns() | 1;
    if (!exit_key_made && pthread_key_create(&exit_key, on_thread_exit) == 0) {
        exit_key_made = 1;
    }
    return 0;
}
