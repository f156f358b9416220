/* Which threads are sampled: a slot per thread, kept in step with the interpreter's threads
 * (threads_sync), paused and resumed, forgotten at a fork. What makes them tick is in
 * thread_timers.c (cpu mode) and wall.c (wall mode).
 */
#include "threads.h"

#include <stdlib.h>
#include <string.h>

slot_t pool[MAX_SLOTS];
slot_t *live[MAX_SLOTS];
Py_ssize_t slot_count;
pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t interval_ns = 10000000;
uint64_t timer_failures;
int all_paused;

Py_ssize_t slot_find(unsigned long ident)
{
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        if (live[i]->ident == ident) {
            return i;
        }
    }
    return -1;
}

void slot_drop(Py_ssize_t index)
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
    Py_ssize_t existing = slot_find(ident);
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

int threads_add(unsigned long ident, pid_t tid)
{
    pthread_mutex_lock(&slots_lock);
    int result = add_locked(ident, tid);
    pthread_mutex_unlock(&slots_lock);
    return result;
}

void threads_remove(unsigned long ident)
{
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = slot_find(ident);
    if (index >= 0) {
        slot_drop(index);
    }
    pthread_mutex_unlock(&slots_lock);
}

int threads_pause(unsigned long ident, int paused)
{
    int result = 0;
    pthread_mutex_lock(&slots_lock);
    Py_ssize_t index = slot_find(ident);
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
            slot_drop(i);
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
        slot_drop(slot_count - 1);
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

void threads_after_fork(void)
{
    /* Only the forking thread lives on in the child, and POSIX timers are not inherited:
     * forget every slot (deleting their timer ids could delete the child's own) and the wall
     * thread. */
    pthread_mutex_init(&slots_lock, NULL);
    for (Py_ssize_t i = 0; i < slot_count; i++) {
        live[i]->in_use = 0;
        live[i]->ident = 0;
    }
    slot_count = 0;
    all_paused = 0;
    wall_after_fork();
}
