/* What a waiting thread waits on (wall mode), from the system call it is blocked in.
 *
 * The wall thread reads /proc/self/task/TID/syscall for a thread it found waiting: the call's
 * number and arguments. A futex is a lock, or the GIL when its address lies in the
 * interpreter's GIL state; a read, write or send names a file descriptor, and what that
 * descriptor is (/proc/self/fd/N) says socket, pipe or file. Nothing here runs in a signal
 * handler. sampler/_waits.py names the reasons, in the order of wait_reason's enum.
 */
#include "native.h"
#include "module.h"

#include "internal/pycore_runtime.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int is_one_of(long number, const long *numbers, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (numbers[i] == number) {
            return 1;
        }
    }
    return 0;
}

#define IS_ONE_OF(number, numbers) is_one_of((number), (numbers), sizeof(numbers) / sizeof((numbers)[0]))

static const long SLEEPS[] = {
#ifdef SYS_nanosleep
    SYS_nanosleep,
#endif
    SYS_clock_nanosleep,
};

static const long POLLS[] = {
#ifdef SYS_poll
    SYS_poll,
#endif
#ifdef SYS_select
    SYS_select,
#endif
#ifdef SYS_epoll_wait
    SYS_epoll_wait,
#endif
#ifdef SYS_epoll_pwait2
    SYS_epoll_pwait2,
#endif
    SYS_ppoll,
    SYS_pselect6,
    SYS_epoll_pwait,
};

/* Calls whose first argument is the file descriptor they wait on. */
static const long ON_A_DESCRIPTOR[] = {
    SYS_read,     SYS_readv,    SYS_pread64,  SYS_preadv,   SYS_write,   SYS_writev,
    SYS_pwrite64, SYS_pwritev,  SYS_recvfrom, SYS_recvmsg,  SYS_recvmmsg, SYS_sendto,
    SYS_sendmsg,  SYS_sendmmsg, SYS_sendfile, SYS_fsync,    SYS_fdatasync, SYS_flock,
    SYS_fcntl,
#ifdef SYS_preadv2
    SYS_preadv2,  SYS_pwritev2,
#endif
};

static const long ACCEPTS[] = {SYS_accept, SYS_accept4};
static const long CHILDREN[] = {SYS_wait4, SYS_waitid};

static const long FILE_CALLS[] = {
#ifdef SYS_open
    SYS_open,
#endif
    SYS_openat,
};

static int descriptor_reason(long fd)
{
    char path[64], target[16];
    snprintf(path, sizeof(path), "/proc/self/fd/%ld", fd);
    ssize_t length = readlink(path, target, sizeof(target) - 1);
    if (length <= 0) {
        return REASON_OTHER;
    }
    target[length] = '\0';
    if (strncmp(target, "socket:", 7) == 0) {
        return REASON_SOCKET;
    }
    if (strncmp(target, "pipe:", 5) == 0) {
        return REASON_PIPE;
    }
    return target[0] == '/' ? REASON_FILE : REASON_OTHER;
}

static int is_the_gil(uintptr_t address)
{
    uintptr_t gil = (uintptr_t)&_PyRuntime.ceval.gil;
    return gil <= address && address < gil + sizeof(_PyRuntime.ceval.gil);
}

int wait_reason(pid_t tid)
{
    char path[64], text[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
    int file = open(path, O_RDONLY | O_CLOEXEC);
    if (file < 0) {
        return REASON_UNKNOWN;
    }
    ssize_t length = read(file, text, sizeof(text) - 1);
    close(file);
    if (length <= 0) {
        return REASON_UNKNOWN;
    }
    text[length] = '\0';
    /* "NUMBER ARG1 ... ARG6 SP PC"; "running", or -1 when not in a system call */
    char *end;
    long number = strtol(text, &end, 10);
    if (end == text || number < 0) {
        return REASON_UNKNOWN;
    }
    unsigned long long first = strtoull(end, NULL, 16);
    if (number == SYS_futex
#ifdef SYS_futex_waitv
        || number == SYS_futex_waitv
#endif
    ) {
        return number == SYS_futex && is_the_gil((uintptr_t)first) ? REASON_GIL : REASON_LOCK;
    }
    if (IS_ONE_OF(number, SLEEPS)) {
        return REASON_SLEEP;
    }
    if (IS_ONE_OF(number, POLLS)) {
        return REASON_POLL;
    }
    if (IS_ONE_OF(number, ON_A_DESCRIPTOR)) {
        return descriptor_reason((long)first);
    }
    if (IS_ONE_OF(number, ACCEPTS)) {
        return REASON_ACCEPT;
    }
    if (number == SYS_connect) {
        return REASON_CONNECT;
    }
    if (IS_ONE_OF(number, CHILDREN)) {
        return REASON_CHILD;
    }
    if (IS_ONE_OF(number, FILE_CALLS)) {
        return REASON_FILE;
    }
    return REASON_OTHER;
}

PyObject *native_wait_reason(PyObject *module, PyObject *arg)
{
    (void)module;
    long tid = PyLong_AsLong(arg);
    if (tid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int reason;
    Py_BEGIN_ALLOW_THREADS
    reason = wait_reason((pid_t)tid);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(reason);
}
