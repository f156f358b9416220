"""The files of ``python -m sampler run`` written once, however the program ends.

``run`` writes them when the program has ended as Python ends it. A program can end sooner,
where it stands: ``os._exit`` (called by a thread, or by the program at the end of its work),
or SIGTERM or SIGHUP at their default action (``timeout``, ``kill``, a container or unit
stopped, a terminal closed). Until 2026-11-29 the run then wrote nothing. So ``os._exit`` is
wrapped, and those two signals are caught where the program has not set them itself, to write
the files first; the process then ends as it would have: with ``os._exit``'s status, or killed
by the signal. A child the program forks writes nothing (the parent writes the files) and
ends as it would have.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import NoReturn

# The longest an early end waits for the files another thread is writing.
WRITE_WAIT = 30.0
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class RunEnd:
    """Calls ``write`` once, in the process that made it: at the end, or at an early one."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._pid = os.getpid()
        self._claims = itertools.count()  # next() is atomic: no lock a signal handler could meet
        self._writer: int | None = None
        self._written = threading.Event()
        self._deferred: int | None = None  # a signal that came while this thread wrote
        self._exit = os._exit
        self._own_exit: Callable[[int], NoReturn] | None = None
        self._caught: list[signal.Signals] = []

    def install(self) -> None:
        """Wraps ``os._exit`` and catches SIGTERM and SIGHUP where they have their default."""
        exit_ = self._exit

        @functools.wraps(exit_)
        def _exit(status: int) -> NoReturn:
            self.write()
            exit_(status)

        self._own_exit = _exit
        os._exit = _exit
        for signum in _SIGNALS:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, self._on_signal)
                self._caught.append(signum)

    def uninstall(self) -> None:
        """Gives back what install() took, where the program has not replaced it since."""
        if os._exit is self._own_exit:
            os._exit = self._exit
        for signum in self._caught:
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, signal.SIG_DFL)
        self._caught = []

    def write(self) -> None:
        """Writes the files unless they are written or being written: then waits for another
        thread's write (WRITE_WAIT at most) and returns."""
        if os.getpid() != self._pid:
            return
        if next(self._claims) == 0:
            self._writer = threading.get_ident()
            try:
                self._write()
            finally:
                self._written.set()
                if self._deferred is not None:
                    _die_of(self._deferred)
        elif self._writer != threading.get_ident():
            self._written.wait(WRITE_WAIT)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._writer == threading.get_ident() and not self._written.is_set():
            self._deferred = signum  # came during this thread's write: it ends after it
            return
        self.write()
        _die_of(signum)


def _die_of(signum: int) -> None:
    """Ends the process by the signal's default action, as it would have ended without us."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
