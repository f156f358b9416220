"""One thread burns CPU; four others wait: in time.sleep, on a lock, in select, on a socket.

In cpu mode only ``burn`` uses CPU. The module map's ``extra`` carries each thread's CPU
seconds from its own clock (``time.pthread_getcpuclockid``): the ground truth.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import _common

deadline = _common.start_script()


def burn() -> None:
    while time.monotonic() < deadline:
        sum(i * i % 7 for i in range(10_000))


def nap() -> None:
    while time.monotonic() < deadline:
        time.sleep(0.2)


def wait_for_lock(lock: threading.Lock) -> None:
    lock.acquire(timeout=max(0.0, deadline - time.monotonic()))


def wait_in_select(pipe_end: socket.socket) -> None:
    select.select([pipe_end], [], [], max(0.0, deadline - time.monotonic()))


def wait_on_socket(quiet: socket.socket) -> None:
    quiet.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        quiet.recv(1)
    except TimeoutError:
        pass


def thread_cpu_seconds(threads: list[threading.Thread]) -> dict[str, float]:
    seconds = {}
    for thread in threads:
        if thread.is_alive() and thread.ident is not None:
            clock = time.pthread_getcpuclockid(thread.ident)
            seconds[thread.name] = round(time.clock_gettime(clock), 4)
    return seconds


held = threading.Lock()
held.acquire()
select_end, _select_other = socket.socketpair()
socket_end, _socket_other = socket.socketpair()
threads = [
    threading.Thread(target=burn, name="burn", daemon=True),
    threading.Thread(target=nap, name="nap", daemon=True),
    threading.Thread(target=wait_for_lock, args=(held,), name="wait_for_lock", daemon=True),
    threading.Thread(target=wait_in_select, args=(select_end,), name="wait_in_select", daemon=True),
    threading.Thread(target=wait_on_socket, args=(socket_end,), name="wait_on_socket", daemon=True),
]
for thread in threads:
    thread.start()
_common.add_extra(lambda: {"thread_cpu_seconds": thread_cpu_seconds(threads)})
_common.write_module_map()
for thread in threads:
    thread.join()
