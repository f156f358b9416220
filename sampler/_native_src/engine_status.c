/* What the sampler reads of the engine as it runs (sampler/_engine_native.py): its counters,
 * whether its signal handlers are still its own, and whether a tracer is attached (the sampler
 * pauses every timer while one is). Everything here is called holding the GIL.
 */
#include "native.h"
#include "module.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The pid tracing this process's main thread (TracerPid in /proc/self/status), or 0: read
 * ten times a second, so without Python file objects. */
PyObject *native_tracer_pid(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    char text[4096];
    ssize_t length = -1;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        length = read(fd, text, sizeof(text) - 1);
        close(fd);
    }
    long pid = 0;
    if (length > 0) {
        text[length] = 0;
        const char *found = strstr(text, "\nTracerPid:");
        if (found != NULL) {
            pid = strtol(found + sizeof("\nTracerPid:") - 1, NULL, 10);
        }
    }
    return PyLong_FromLong(pid);
}

PyObject *native_handler_ns(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&stats.handler_ns));
}

PyObject *native_handlers_are_ours(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(handler_is_ours() && guard_is_ours());
}

PyObject *native_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsnsKsnsKsK}", "samples", (unsigned long long)atomic_load(&stats.samples),
        "torn", (unsigned long long)atomic_load(&stats.torn),
        "weight", (unsigned long long)atomic_load(&stats.weight), "dropped",
        (unsigned long long)atomic_load(&stats.dropped), "faults",
        (unsigned long long)atomic_load(&stats.faults), "no_python",
        (unsigned long long)atomic_load(&stats.no_python), "handler_ns",
        (unsigned long long)atomic_load(&stats.handler_ns), "signals",
        (unsigned long long)atomic_load(&stats.signals), "threads", threads_count(),
        "timer_failures", (unsigned long long)threads_timer_failures(), "names_cached",
        codemap_size(), "tags_open", (unsigned long long)tags_open(), "tags_lost",
        (unsigned long long)tags_lost());
}
