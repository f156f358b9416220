/* The thread registry's parts, shared by thread_slots.c (which threads are sampled),
 * thread_timers.c (cpu mode's timers) and wall.c (wall mode's thread); native.h declares what
 * the rest of the engine calls.
 */
#ifndef FLEETFLAME_THREADS_H
#define FLEETFLAME_THREADS_H

#include "native.h"

#include <pthread.h>
#include <time.h>

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

extern slot_t pool[MAX_SLOTS];
extern slot_t *live[MAX_SLOTS]; /* the slots in use, in no particular order */
extern Py_ssize_t slot_count;
extern pthread_mutex_t slots_lock;
extern uint64_t interval_ns;
extern uint64_t timer_failures;
extern int all_paused; /* a tracer is attached: no signals at all (see threads_pause_all) */

/* -- the slots (thread_slots.c), called holding slots_lock -------------------------------- */

Py_ssize_t slot_find(unsigned long ident);
void slot_drop(Py_ssize_t index);

/* -- cpu mode's timers (thread_timers.c) -------------------------------------------------- */

uint64_t clock_ns(clockid_t clock);
struct timespec timespec_of(uint64_t ns);
int create_timer(slot_t *slot);
/* Arms the slot's timer again (a new interval, paused or not); a thread that ended meanwhile
 * is no failure. */
int reset_timer(slot_t *slot);

/* -- the wall thread (wall.c) ------------------------------------------------------------- */

/* In a forked child: forgets the wall thread, which did not come along. */
void wall_after_fork(void);

#endif
