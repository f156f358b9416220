/* Threads as the interpreter and the kernel know them: the interpreter's list of thread
 * states, which the registry's sync (thread_slots.c) and the stall watcher (gil.c) read, and
 * the id of a thread's CPU clock.
 */
#include "native.h"

#include "internal/pycore_runtime.h"

#include <stdlib.h>

clockid_t thread_cpu_clock(pid_t tid)
{
    /* The kernel's encoding of a thread's CPU clock (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED), as
     * glibc's pthread_getcpuclockid builds it, from the kernel thread id. */
    return (clockid_t)((~(unsigned int)tid << 3) | 6u);
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
