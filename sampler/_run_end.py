"""The files of ``python -m sampler run`` (and ``trace``) written once, even at ``os._exit``.

``run`` writes them when the program has ended as Python ends it. A program that calls
``os._exit`` (a thread, or the program at the end of its work) ends where it stands, and until
2026-11-29 the run then wrote nothing. So ``os._exit`` is wrapped to write the files first, then
exit with its status. The write runs on a thread of its own, waited for WRITE_WAIT at most: the
caller may hold a lock the write needs (an ``os._exit`` in a signal handler that interrupted
the sampler), and then the process exits without the files rather than hang. A child the
program forks writes nothing (the parent writes the files).

SIGTERM and SIGHUP still end a run without its files: catching them would need a Python
handler, which runs only on the main thread between bytecodes, so a process whose main thread
waits on a lock (joining a thread) would no longer die of them at all, and a program asking
``signal.getsignal`` would see a handler it did not set (a review found both).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

# The longest an early end waits for the files to be written.
WRITE_WAIT = 30.0


class RunEnd:
    """Calls ``write`` once, in the process that made it: at the end, or at an ``os._exit``."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._pid = os.getpid()
        self._claims = itertools.count()  # next() is atomic: no lock to meet
        self._written = threading.Event()
        self._exit = os._exit
        self._own_exit: Callable[[int], NoReturn] | None = None

    def install(self) -> None:
        """Wraps ``os._exit`` so that the files are written before it exits."""
        exit_ = self._exit

        @functools.wraps(exit_)
        def _exit(status: int) -> NoReturn:
            try:
                self.write_aside()
            finally:
                exit_(status)

        self._own_exit = _exit
        os._exit = _exit

    def uninstall(self) -> None:
        """Gives ``os._exit`` back, unless the program has replaced it since."""
        if os._exit is self._own_exit:
            os._exit = self._exit

    def write(self) -> None:
        """Writes the files unless they are written or being written (then waits for them,
        WRITE_WAIT at most)."""
        if os.getpid() != self._pid:
            return  # a child the program forked
        if next(self._claims) == 0:
            try:
                self._write()
            finally:
                self._written.set()
        else:
            self._written.wait(WRITE_WAIT)

    def write_aside(self) -> None:
        """write() on a thread of its own, waited for WRITE_WAIT at most."""
        if os.getpid() != self._pid or self._written.is_set():
            return
        writer = threading.Thread(target=self.write, name="fleetflame-write", daemon=True)
        writer.start()
        writer.join(WRITE_WAIT)
