"""What a waiting thread waits on, named as a frame under ``[waiting]`` (wall mode).

A thread found waiting is blocked in a system call; /proc/self/task/TID/syscall gives its
number and arguments. A futex is a lock (or the GIL: only the native engine knows the GIL's
address), a read, write or send names a descriptor that is a socket, a pipe or a file, and
so on. The native engine classifies in C (_native_src/waits.c), in the order of REASONS; this
module names the reasons and classifies for the python engine, on x86-64 Linux (elsewhere
its waiting samples carry no reason).
"""

from __future__ import annotations

import os
import sys

WAITING = "[waiting]"

# Indexed by the native engine's wait_reason(); None: not known (no frame is added).
REASONS: tuple[str | None, ...] = (
    None,
    "[lock]",  # a futex: threading.Lock, Condition, Event, queue.get, join
    "[GIL]",  # a futex in the interpreter's GIL: ready to run Python, waiting for its turn
    "[sleep]",
    "[poll]",  # select, poll, epoll: an event loop's idle time, a socket read with a timeout
    "[socket]",
    "[pipe]",
    "[file]",
    "[accept]",
    "[connect]",
    "[child process]",
    "[other syscall]",
)
LOCK, GIL, SLEEP, POLL, SOCKET, PIPE, FILE, ACCEPT, CONNECT, CHILD, OTHER = range(1, 12)

# x86-64 system call numbers (the python engine only; the native engine uses the C headers').
_X86_64: dict[int, int] = {
    202: LOCK,  # futex
    449: LOCK,  # futex_waitv
    35: SLEEP,  # nanosleep
    230: SLEEP,  # clock_nanosleep
    **dict.fromkeys((7, 23, 232, 270, 271, 281, 441), POLL),  # poll select epoll_wait ...
    43: ACCEPT,
    288: ACCEPT,
    42: CONNECT,
    61: CHILD,  # wait4
    247: CHILD,  # waitid
    2: FILE,  # open
    257: FILE,  # openat
}
# read write pread64 pwrite64 readv writev sendfile sendto recvfrom sendmsg recvmsg fcntl
# flock fsync fdatasync preadv pwritev recvmmsg sendmmsg preadv2 pwritev2: on a descriptor.
_ON_A_DESCRIPTOR = frozenset(
    (0, 1, 17, 18, 19, 20, 40, 44, 45, 46, 47, 72, 73, 74, 75, 295, 296, 299, 307, 327, 328)
)
_KNOWN = sys.platform.startswith("linux") and os.uname().machine == "x86_64"


def reason_of(tid: int | None) -> int:
    """What thread ``tid`` (its native id) of this process is blocked in: an index of REASONS."""
    if tid is None or not _KNOWN:
        return 0
    try:
        with open(f"/proc/self/task/{tid}/syscall", "rb") as file:
            fields = file.read(256).split()
    except OSError:
        return 0
    try:
        number = int(fields[0])
        first = int(fields[1], 16) if len(fields) > 1 else 0
    except ValueError:  # "running"
        return 0
    if number < 0:
        return 0
    if number in _ON_A_DESCRIPTOR:
        return _descriptor_reason(first)
    return _X86_64.get(number, OTHER)


def _descriptor_reason(fd: int) -> int:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return OTHER
    if target.startswith("socket:"):
        return SOCKET
    if target.startswith("pipe:"):
        return PIPE
    return FILE if target.startswith("/") else OTHER
