"""The sampler's own threads set up: named for the operating system, so `top -H` and `ps -L`
tell them apart, and deaf to the signals the host's threads are there to take.

CPython 3.11 leaves every thread named as its process; Linux lets a process rename its own
threads through /proc (15 bytes). ``fleetflame-stalls`` shows as ``ff-stalls``.

A signal sent to the process goes to any one of its threads that does not block it. A host
whose handler must interrupt its own thread's wait missed it when it landed on ours: a uWSGI
worker stayed in ``epoll_wait`` after SIGTERM until it was killed 30 s later. Our threads block
every signal but the synchronous ones (a fault is its own thread's) and SIGPROF (the sampling
timer's, which the python engine's driver may take on any thread). Under gevent's or
eventlet's monkey patching a thread started is a greenlet on the host's OS thread, and blocking
there blocked SIGTERM for the whole worker (a gunicorn gevent worker took 20 s to stop): the
set-up is skipped.
"""

from __future__ import annotations

import signal
import threading

_KEPT = {
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGABRT,
    signal.SIGSYS,
    signal.SIGPROF,
}


def own_thread() -> None:
    """Sets up the calling thread as one of the sampler's: host signals blocked, then named
    (so that a thread the OS shows by our name blocks them already). Not under green threads
    (see green_threads): a "thread" is then a greenlet on the host's own OS thread."""
    if green_threads() is not None:
        return
    block_host_signals()
    name_os_thread()


def green_threads() -> str | None:
    """The module of gevent or eventlet that took over starting threads (their monkey
    patching: ``gevent.thread``), or None while a thread is an OS thread. Only theirs: a
    debugger (pydevd) wraps the same function and its threads are the OS's."""
    for name in ("_start_new_thread", "_start_joinable_thread"):  # 3.13 starts by the second
        module = getattr(getattr(threading, name, None), "__module__", None)
        if isinstance(module, str) and module.startswith(("gevent", "eventlet")):
            return module
    return None


def block_host_signals() -> None:
    """Blocks in the calling thread every signal but the synchronous ones and SIGPROF, so the
    process's signals go to the host's threads; never fails."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _KEPT)
    except (AttributeError, OSError, ValueError):
        pass  # not POSIX: nothing to do


def name_os_thread() -> None:
    """Names the calling thread for the OS after its Python name; never fails."""
    name = threading.current_thread().name
    if name.startswith("fleetflame-"):
        name = "ff-" + name[len("fleetflame-") :]
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except (OSError, ValueError):
        pass  # not Linux, or /proc not mounted: the name is only a convenience
