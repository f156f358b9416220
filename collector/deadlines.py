"""Fetch deadlines that no read can outlast.

A socket timeout bounds one read, not a fetch: a target that sends its answer's head (or a
chunked body's size lines) one byte just inside each timeout keeps ``http.client`` reading for
as long as it likes, and holds a poll thread. So one daemon thread per poller watches every
fetch's deadline and, at it, shuts down the socket of a fetch still running: its read ends at
once and the fetch fails as timed out.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time

__all__ = ["Deadlines", "Watch"]


class Watch:
    """One fetch's deadline; ``cut`` once its socket was shut down at the deadline."""

    __slots__ = ("due", "sock", "cut", "ended")

    def __init__(self, due: float) -> None:
        self.due = due
        self.sock: socket.socket | None = None
        self.cut = False
        self.ended = False


class Deadlines:
    """Shuts down the socket of each fetch still running at its deadline (monotonic time)."""

    def __init__(self, name: str = "fleetflame-poll-deadlines") -> None:
        self._name = name
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self, seconds: float) -> Watch:
        """Begins watching a fetch that must end within ``seconds`` from now."""
        watch = Watch(time.monotonic() + seconds)
        with self._wake:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            earliest = not self._due or watch.due < self._due[0][0]
            heapq.heappush(self._due, (watch.due, next(self._order), watch))
            if earliest:
                self._wake.notify()
        return watch

    def follow(self, watch: Watch, sock: socket.socket | None) -> None:
        """Names the socket the fetch now reads (a new connection): shut down at the deadline,
        or now if it has passed."""
        with self._wake:
            watch.sock = sock
            if watch.cut:
                _shut(sock)

    def end(self, watch: Watch) -> bool:
        """Stops watching the fetch; tells whether it was cut at its deadline."""
        with self._wake:
            watch.ended = True
            watch.sock = None
            return watch.cut

    def stop(self) -> None:
        """Ends the watching thread (fetches running then are no longer cut)."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        with self._wake:
            while not self._stopped:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    watch = heapq.heappop(self._due)[2]
                    if not watch.ended:
                        watch.cut = True
                        _shut(watch.sock)
                self._wake.wait(self._due[0][0] - now if self._due else None)


def _shut(sock: socket.socket | None) -> None:
    """Ends every read and write on ``sock`` (its owner closes it)."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile, or never connected
