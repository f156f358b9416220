"""The WSGI side of the endpoint's server: a request's environ, the app called on a worker
thread with its whole answer encoded, and parking.

The server's event loop hands a request to a fixed pool of workers (``Workers``) and gets back
the answer, or that the app parked the request. An app can answer later without holding a
thread: ``environ[PARK](seconds, then)`` parks the request in the event loop and returns the
iterable the app must return; ``then``, a WSGI app, answers it on a worker once ``seconds``
have passed. It returns None when ``max_parked`` requests are already waiting.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from io import BytesIO
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from ._http_messages import encode_answer, encode_error, keeps_alive, parse_head
from ._osthread import block_host_signals

if TYPE_CHECKING:
    from ._http_connection import Connection

log = logging.getLogger("sampler")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
App = Callable[[Environ, StartResponse], Iterable[bytes]]
Park = Callable[[float, App], Iterable[bytes] | None]

PARK = "fleetflame.park"


class Parked:
    """A worker's outcome for a parked request: answer it with ``then`` at ``wake``."""

    __slots__ = ("wake", "then")

    def __init__(self, wake: float, then: App) -> None:
        self.wake, self.then = wake, then


class ParkSlots:
    """How many requests are parked, at most ``limit``: a worker takes a slot, the loop gives
    it back once the request is answered or gone."""

    def __init__(self, limit: int) -> None:
        self.count = 0
        self._limit = limit
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Takes a slot; False when all are taken."""
        with self._lock:
            if self.count >= self._limit:
                return False
            self.count += 1
            return True

    def give_back(self) -> None:
        """Gives a taken slot back."""
        with self._lock:
            self.count -= 1


def request_environ(head: bytes, peer: str, host: str, port: int) -> Environ:
    """Returns the WSGI environ of a request head; raises ``Refused`` for a bad one."""
    method, target, version, headers = parse_head(head)
    path, _, query = target.partition("?")
    environ: Environ = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": host,
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": version,
        "REMOTE_ADDR": peer,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": BytesIO(),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in headers:
        key = "HTTP_" + name.upper().replace("-", "_")
        environ[key] = f"{environ[key]}, {value}" if key in environ else value
    return environ


def call_app(app: App, environ: Environ, slots: ParkSlots | None) -> tuple[bytes, bool] | Parked:
    """Calls the app; returns its whole answer and whether to keep the connection, or that it
    parked the request (only given ``slots`` to park in)."""
    parked: list[Parked] = []

    def park(seconds: float, then: App) -> Iterable[bytes] | None:
        if parked or slots is None or not slots.take():
            return None
        parked.append(Parked(time.monotonic() + seconds, then))
        return ()

    started: list[tuple[str, list[tuple[str, str]]]] = []
    body: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, headers)]
        return body.append

    if slots is not None:
        environ[PARK] = park
    try:
        result = app(environ, start_response)
        try:
            body.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if parked:
            return parked[0]
        if not started:
            raise RuntimeError("the WSGI app returned without calling start_response")
        status, headers = started[0]
        keep = keeps_alive(environ.get("HTTP_CONNECTION", ""))
        head_only = environ["REQUEST_METHOD"] == "HEAD"
        return encode_answer(status, headers, body, head_only=head_only, keep_alive=keep), keep
    except Exception:  # noqa: BLE001 - one failed request must not end a worker
        log.exception("fleetflame endpoint: the app failed on %s", environ.get("PATH_INFO"))
        if parked and slots is not None:
            slots.give_back()
        failed = encode_error(
            "500 Internal Server Error", "the endpoint failed; see the host's log"
        )
        return failed, False
    finally:
        environ.pop(PARK, None)


class Workers:
    """A fixed pool of threads calling apps for the event loop: each answer is queued in
    ``answers`` with its connection, then the loop woken."""

    def __init__(
        self,
        count: int,
        name: str,
        slots: ParkSlots,
        wake: Callable[[], None],
        thread_started: Callable[[], None],
        thread_exited: Callable[[], None],
    ) -> None:
        self.slots = slots
        self.answers: deque[tuple[Connection, tuple[bytes, bool] | Parked]] = deque()
        self._jobs: queue.SimpleQueue[tuple[Connection, App, bool] | None] = queue.SimpleQueue()
        self._wake = wake
        self._thread_started = thread_started
        self._thread_exited = thread_exited
        self.threads = [
            threading.Thread(target=self._work, name=f"{name}-worker-{i}", daemon=True)
            for i in range(1, count + 1)
        ]

    def submit(self, conn: Connection, app: App, *, may_park: bool) -> None:
        """Has a worker call ``app`` with ``conn.environ``."""
        self._jobs.put((conn, app, may_park))

    def stop(self) -> None:
        """Has every worker end once the jobs before are done."""
        for _ in self.threads:
            self._jobs.put(None)

    def _work(self) -> None:
        block_host_signals()
        self._thread_started()
        try:
            while (job := self._jobs.get()) is not None:
                conn, app, may_park = job
                answer = call_app(app, conn.environ, self.slots if may_park else None)
                self.answers.append((conn, answer))
                self._wake()
        finally:
            self._thread_exited()
