"""One connection of the endpoint's server, and the deadlines its event loop keeps.

A connection is reading its request head, with a worker, parked, writing its answer, or
lingering until the client closes. Each state has a deadline; the loop sleeps until the
earliest and acts on those that have passed.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    import socket

    from ._http_workers import App, Environ

READING, WORKING, PARKED, WRITING, LINGERING = range(5)


class Connection:
    """A client's socket, its state, what it sent and what it is sent, and its deadline."""

    __slots__ = (
        "sock",
        "peer",
        "state",
        "inbox",
        "outbox",
        "deadline",
        "environ",
        "then",
        "keep",
        "idle",
    )

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.state = READING
        self.inbox = bytearray()
        self.outbox = memoryview(b"")
        self.deadline = deadline
        self.environ: Environ = {}
        self.then: App | None = None
        self.keep = False  # keep the connection open once this answer is written
        self.idle = False  # kept open, waiting for the first byte of its next request


class Deadlines:
    """The deadlines the event loop waits for, earliest first. Setting a connection's deadline
    leaves its earlier one in the heap: it is stale once it no longer matches
    ``conn.deadline``. A deadline without a connection ends the pause in accepting."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Connection | None]] = []
        self._sequence = 0

    def set(self, conn: Connection | None, deadline: float) -> None:
        """Adds a deadline (the connection's own, from now on)."""
        if conn is not None:
            conn.deadline = deadline
        self._sequence += 1
        heapq.heappush(self._heap, (deadline, self._sequence, conn))

    def timeout(self) -> float | None:
        """Returns the seconds until the earliest deadline, or None without one."""
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - time.monotonic())

    def passed(self, now: float) -> Iterator[tuple[float, Connection | None]]:
        """Takes out and yields the deadlines up to ``now``, those set meanwhile too."""
        while self._heap and self._heap[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._heap)
            yield deadline, conn
