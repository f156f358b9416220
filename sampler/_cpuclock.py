"""Another thread's CPU time, read by its kernel thread id.

``time.pthread_getcpuclockid(ident)`` reads the kernel id out of the thread's pthread struct,
which lives on the thread's stack: a thread that exits between the moment it was listed and
the read may have had its stack unmapped already, and the read crashes the process (it did,
under a thread-per-request server). Linux names a thread's CPU clock after its kernel id
alone, so this builds the clock id from the id ``threading`` keeps; a thread that has exited
then answers an error, never a crash.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time

AVAILABLE = sys.platform == "linux" and hasattr(time, "clock_gettime")

# Kernel ids threading has wrong: before Python 3.12 a forked child's thread keeps its
# parent's id (threading's own after-fork step does not read it again).
_forked: dict[int, tuple[threading.Thread, int]] = {}


def _after_fork_in_child() -> None:
    _forked.clear()
    _forked[threading.get_ident()] = (threading.current_thread(), threading.get_native_id())


def note_a_fork() -> None:
    """Corrects the main thread's kernel id where a fork left its parent's: run at import (a
    gunicorn worker loading its app after the fork, from any of its threads) and at each
    start (a process forked in C after the import, as uWSGI forks, where no fork hook ran)."""
    # The thread that forked is the child's main thread, and may carry its parent's id. On
    # Linux a child's main thread has the process's id; the stale one names no thread here.
    main = threading.main_thread()
    stale = getattr(main, "native_id", None)
    if AVAILABLE and stale is not None and stale != os.getpid():
        if not os.path.exists(f"/proc/self/task/{stale}"):
            _forked[main.ident] = (main, os.getpid())  # type: ignore[index]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
note_a_fork()


# The main thread's ident as the OS knows it (sys._current_frames' key), and the calling
# thread's: gevent's monkey patching makes threading's get_ident a greenlet's id and keys its
# table of threads by that, so the main thread was not found (with the python engine started
# before patching, a busy greenlet had its CPU clock unread: 3 samples in 6 s of CPU).
_MAIN_IDENT = threading.main_thread().ident
os_thread_ident = _thread.get_ident


def thread_of(ident: int) -> threading.Thread | None:
    """The Python thread of a thread ident as the OS knows it, or None."""
    thread: threading.Thread | None = threading._active.get(ident)  # type: ignore[attr-defined]
    if thread is None and ident == _MAIN_IDENT:
        return threading.main_thread()
    return thread


def thread_name(ident: int | None) -> str:
    """The name of a thread ident as the OS knows it: its Python thread's, else the ident.
    Under gevent's patch threading knows greenlets, not the OS's main thread, which requests
    and stalls are told by."""
    thread = thread_of(ident) if ident is not None else None
    if thread is not None:
        return thread.name
    return "?" if ident is None else str(ident)


def native_id_of(ident: int) -> int | None:
    """The kernel id of a Python thread, or None when ``threading`` does not know it."""
    thread = thread_of(ident)
    forked = _forked.get(ident)
    if forked is not None and forked[0] is thread:
        return forked[1]
    return getattr(thread, "native_id", None)


def thread_cpu_time(ident: int) -> float | None:
    """The CPU seconds a Python thread used, or None: the thread is gone, or ``threading``
    does not know its kernel id (a thread started by C code that never asked for
    ``threading.current_thread()``), or this platform has no per-thread clocks."""
    native_id = native_id_of(ident)
    if native_id is None or not AVAILABLE:
        return None
    try:
        # Linux's id of a thread's CPU clock (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED, the kernel
        # id inverted in the bits above), as glibc's pthread_getcpuclockid builds it.
        return time.clock_gettime((~native_id << 3) | 6)
    except OSError:
        return None
