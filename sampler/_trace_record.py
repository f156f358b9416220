"""Recording every call and return of every thread into bounded per-thread buffers.

An event is two appends to its thread's buffer: a timestamp (``time.perf_counter_ns``) to an
``array('q')`` and what happened to a list: the code object for a Python call or resumption,
a key naming the C function for a C call, ``None`` for any return, yield or unwind. That is 16
bytes an event. Threads take their events from a shared budget in chunks; when it is spent,
recording stops everywhere. The two ways events get here, ``sys.monitoring`` and
``sys.setprofile``, are in ``_trace_backends``.
"""

from __future__ import annotations

import sys
import threading
from array import array
from time import perf_counter_ns

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Events a thread takes from the shared budget at a time: the bound is exact to within this
# many events a thread. A thread not yet named takes small ones, to be named soon after
# threading registers it (its first events come before that), for a while.
CHUNK = 4096
UNNAMED_CHUNK = 16
NAMING_TRIES = 64


class Buffer:
    """One thread's events: their times and what each was."""

    __slots__ = (
        "times",
        "objs",
        "t",
        "o",
        "left",
        "ident",
        "native_id",
        "name",
        "excluded",
        "naming_tries",
        "released",
        "lost",
    )

    def __init__(self, ident: int, native_id: int, name: str, excluded: bool) -> None:
        self.times = array("q")
        self.objs: list[Any] = []
        self.t = self.times.append
        self.o = self.objs.append
        self.left = 0  # events this thread may still record before asking the budget
        self.ident = ident
        self.native_id = native_id
        self.name = name
        self.excluded = excluded
        self.naming_tries = 0
        self.released = False  # the recording stopped here as it should (sys.setprofile)
        self.lost = False  # this thread's profile function was taken away while recording


class Recorder:
    """The buffers of every thread, the shared budget, and whether recording has stopped."""

    def __init__(self, max_events: int, excluded: set[int] | None = None) -> None:
        self.buffers: list[Buffer] = []
        self.pool = max_events
        self.max_events = max_events
        self.excluded = excluded if excluded is not None else set()
        self.c_keys: dict[tuple[type, str], tuple[type, str]] = {}
        self.start_ns = 0
        self.end_ns = 0
        self.stopped = False
        self.reason = ""
        self.halts: list[Callable[[], None]] = []
        self.on_stop: Callable[[], None] | None = None
        self._lock = threading.Lock()  # taken only inside callbacks, which record nothing
        self._stopping = threading.Lock()

    def new_buffer(self) -> Buffer:
        """Returns a buffer for the calling thread (a new one each time a thread joins)."""
        ident = threading.get_ident()
        buffer = Buffer(ident, threading.get_native_id(), "", ident in self.excluded)
        _name(buffer)
        with self._lock:
            self.buffers.append(buffer)
        return buffer

    def take(self, buffer: Buffer) -> int:
        """Gives a thread its next chunk of the budget; 0 once recording has stopped, and when
        the budget is spent (which stops recording)."""
        if buffer.excluded or self.stopped:
            return 0
        if not buffer.name and buffer.naming_tries < NAMING_TRIES:
            buffer.naming_tries += 1
            _name(buffer)
        with self._lock:
            # Smaller as the budget runs out, so that when it is spent the other threads hold
            # little of it unused: the trace stops near max_events, however many threads.
            size = (
                UNNAMED_CHUNK if buffer.naming_tries < NAMING_TRIES and not buffer.name else CHUNK
            )
            chunk = min(size, max(1, self.pool // 16), self.pool)
            self.pool -= chunk
        if not chunk:
            self.stop("max_events")
        return chunk

    def stop(self, reason: str) -> bool:
        """Stops recording in every thread (at their next event); False if it had stopped.

        Called from the host's code (itself recorded until it returns) and from inside a
        recording callback: no lock a callback takes is held here.
        """
        if not self._stopping.acquire(blocking=False):
            return False
        self.stopped = True
        self.end_ns = perf_counter_ns()
        self.reason = reason
        self.pool = 0
        for halt in self.halts:
            halt()
        if self.on_stop is not None:
            self.on_stop()
        return True

    def events(self) -> int:
        """Returns the number of events recorded so far."""
        return sum(min(len(b.times), len(b.objs)) for b in self.buffers if not b.excluded)


def _name(buffer: Buffer) -> None:
    # threading's registry read without its lock: a thread's first event may come while it
    # holds that lock. Before threading has registered a new thread, it is not there yet.
    thread = getattr(threading, "_active", {}).get(buffer.ident)
    if thread is not None and getattr(thread, "native_id", buffer.native_id) == buffer.native_id:
        buffer.name = thread.name
        return
    # Not yet registered (sys.monitoring's first events of a thread come before that, and a
    # short thread may make few after): a thread threading started runs Thread._bootstrap
    # outermost, whose self is the Thread, named since Thread() was made.
    frame = sys._getframe(1)
    while frame.f_back is not None:
        frame = frame.f_back
    if frame.f_code.co_name == "_bootstrap" and frame.f_globals.get("__name__") == "threading":
        thread = frame.f_locals.get("self")
        if isinstance(thread, threading.Thread) and buffer.ident == threading.get_ident():
            buffer.name = thread.name
