"""A small HTTP server for WSGI apps embedded in someone else's process: bounded whatever clients do.

One event-loop thread (stdlib ``selectors``) accepts connections, reads request heads without
blocking, and writes answers without blocking; a fixed pool of worker threads calls the app
(``_http_workers``, which also parks requests: ``environ[PARK]``). So the threads it owns are
fixed at start, a client dripping its request or never reading its answer holds no thread,
every request has a whole deadline (its head read in ``head_timeout``, its answer written in
``write_timeout``, not per ``recv``), connections past a cap close the oldest still unread, and
``stop()`` wakes the loop through a socket pair instead of polling.

``GET`` and ``HEAD`` only, no request bodies (parsing and encoding are in ``_http_messages``).
A connection serves one request (``Connection: close``) unless the client asks to keep it
(``Connection: keep-alive``, as a collector polling every few seconds does): then it waits for
the next request up to ``keep_alive_timeout``. Answers are built whole in memory (endpoints of
a few megabytes at most).
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ._http_connection import LINGERING, PARKED, READING, WORKING, WRITING, Connection, Deadlines
from ._http_messages import MAX_HEAD, Refused, encode_error, head_end
from ._http_workers import (
    PARK,
    App,
    Environ,
    Park,
    Parked,
    ParkSlots,
    StartResponse,
    Workers,
    request_environ,
)
from ._osthread import own_thread

log = logging.getLogger("sampler")

__all__ = ["PARK", "App", "Environ", "Park", "Server", "StartResponse"]

WORKERS = 4
MAX_CONNECTIONS = 256
MAX_PARKED = 32
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
# How long a kept connection waits for its next request: longer than a collector's interval.
KEEP_ALIVE_TIMEOUT = 120.0
# After answering, the connection waits this long for the client to close: closing a socket
# with unread input resets it, and the client could lose the answer.
LINGER = 1.0
_ACCEPT_PAUSE = 0.1  # out of file descriptors: stop accepting this long rather than spin


class Server:
    """Serves a WSGI app on daemon threads (one event loop, ``workers`` workers) until ``stop()``."""

    def __init__(
        self,
        app: App,
        host: str,
        port: int,
        *,
        name: str = "fleetflame-endpoint",
        workers: int = WORKERS,
        max_connections: int = MAX_CONNECTIONS,
        max_parked: int = MAX_PARKED,
        head_timeout: float = HEAD_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
        on_thread_start: Callable[[int], None] | None = None,
        on_thread_exit: Callable[[int], None] | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self._app = app
        self._host = host
        self._max_connections = max_connections
        self._head_timeout = head_timeout
        self._write_timeout = write_timeout
        self._keep_alive_timeout = keep_alive_timeout
        self._on_thread_start = on_thread_start
        self._on_thread_exit = on_thread_exit
        self._connections: dict[Connection, None] = {}  # an ordered set: oldest first
        self._deadlines = Deadlines()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_in, selectors.EVENT_READ, "wake")
        self._stopping = False
        self._stopped = False
        self._workers = Workers(
            workers,
            name,
            ParkSlots(max_parked),
            self._wake,
            self._thread_started,
            self._thread_exited,
        )
        self._threads = [threading.Thread(target=self._loop, name=name, daemon=True)]
        self._threads += self._workers.threads
        for thread in self._threads:
            thread.start()

    @property
    def parked(self) -> int:
        """How many requests are parked now."""
        return self._workers.slots.count

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._connections)

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads this server owns (fixed at start)."""
        return list(self._threads)

    def stop(self) -> None:
        """Stops serving: closes the port and every connection, and ends the threads."""
        if self._stopped:
            return
        self._stopped = self._stopping = True
        self._wake()
        self._workers.stop()
        me = threading.current_thread()
        for thread in self._threads:
            if thread is not me:
                thread.join(timeout=5)
        self._wake_out.close()

    def close_inherited(self) -> None:
        """Closes the sockets a forked child inherited (its threads did not survive the fork)."""
        self._stopped = self._stopping = True
        for conn in list(self._connections):
            conn.sock.close()
        for sock in (self._listener, self._wake_in, self._wake_out):
            sock.close()
        self._selector.close()

    # -- the event loop --------------------------------------------------------------------

    def _loop(self) -> None:
        self._thread_started()
        try:
            while not self._stopping:
                for key, mask in self._selector.select(self._deadlines.timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data not in self._connections:
                        continue  # closed by an earlier event of this batch (evicted)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(key.data)
                    else:
                        self._read(key.data)
                answers = self._workers.answers
                while answers:
                    self._answered(*answers.popleft())
                self._expire(time.monotonic())
        except Exception:  # noqa: BLE001 - the host must never see the endpoint fail
            log.exception("fleetflame endpoint: the event loop failed; endpoint stopped")
        finally:
            for conn in list(self._connections):
                self._close(conn)
            self._selector.close()
            self._listener.close()
            self._wake_in.close()
            self._thread_exited()

    def _expire(self, now: float) -> None:
        for deadline, conn in self._deadlines.passed(now):
            if conn is None:  # the accept pause is over
                self._selector.register(self._listener, selectors.EVENT_READ, "accept")
            elif conn in self._connections and conn.deadline == deadline:
                self._on_deadline(conn)

    def _on_deadline(self, conn: Connection) -> None:
        if conn.idle:
            self._close(conn)  # a kept connection nobody used again
        elif conn.state == READING:
            self._respond(conn, encode_error("408 Request Timeout", "request not received in time"))
        elif conn.state == PARKED and conn.then is not None:
            then = conn.then
            self._unpark(conn)
            self._unwatch(conn)
            self._dispatch(conn, then, may_park=False)
        elif conn.state != WORKING:
            # A client that does not read its answer, or does not close after it.
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._selector.unregister(self._listener)
                    self._deadlines.set(None, time.monotonic() + _ACCEPT_PAUSE)
                return
            sock.setblocking(False)
            if len(self._connections) >= self._max_connections and not self._evict_oldest():
                sock.close()
                continue
            conn = Connection(sock, str(address[0]), 0.0)
            self._connections[conn] = None
            self._deadlines.set(conn, time.monotonic() + self._head_timeout)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict_oldest(self) -> bool:
        # The oldest connection still sending its request (a slow or idle client) or already
        # answered; never one being answered or parked.
        for conn in self._connections:
            if conn.state in (READING, LINGERING):
                self._close(conn)
                return True
        return False

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(16384)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._close(conn)
            return
        if conn.state != READING:
            # A parked or answered client's extra bytes are read only to notice when it
            # closes (or, kept alive, as its next request); one that keeps sending is cut off.
            conn.inbox += data
            if len(conn.inbox) > MAX_HEAD:
                self._close(conn)
            return
        if conn.idle:  # a kept connection's next request begins: its head has the usual time
            conn.idle = False
            self._deadlines.set(conn, time.monotonic() + self._head_timeout)
        searched = max(0, len(conn.inbox) - 3)
        conn.inbox += data
        self._take_head(conn, searched)

    def _take_head(self, conn: Connection, searched: int = 0) -> None:
        end = head_end(conn.inbox, searched)
        if end > MAX_HEAD or (end < 0 and len(conn.inbox) > MAX_HEAD):
            too_big = f"request head larger than {MAX_HEAD} bytes"
            self._respond(conn, encode_error("431 Request Header Fields Too Large", too_big))
            return
        if end < 0:
            return
        head, conn.inbox = bytes(conn.inbox[:end]), conn.inbox[end:]  # the rest: a next request
        try:
            conn.environ = request_environ(head, conn.peer, self._host, self.port)
        except Refused as exc:
            self._respond(conn, encode_error(exc.status, str(exc)))
            return
        self._unwatch(conn)
        self._dispatch(conn, self._app, may_park=True)

    def _dispatch(self, conn: Connection, app: App, *, may_park: bool) -> None:
        # No deadline while a worker has it: the app's time is the app's.
        conn.state, conn.deadline = WORKING, float("inf")
        self._workers.submit(conn, app, may_park=may_park)

    def _answered(self, conn: Connection, answer: tuple[bytes, bool] | Parked) -> None:
        if conn not in self._connections:  # closed meanwhile (stop, or the client left)
            if isinstance(answer, Parked):
                self._unpark(conn)
            return
        if isinstance(answer, Parked):
            conn.state, conn.then = PARKED, answer.then
            self._deadlines.set(conn, answer.wake)
            self._watch(conn, selectors.EVENT_READ)  # to notice a client that gives up
        else:
            self._respond(conn, *answer)

    def _respond(self, conn: Connection, answer: bytes, keep: bool = False) -> None:
        conn.state = WRITING
        conn.keep = keep and not self._stopping
        conn.outbox = memoryview(answer)
        self._deadlines.set(conn, time.monotonic() + self._write_timeout)
        self._write(conn)

    def _write(self, conn: Connection) -> None:
        try:
            while conn.outbox:
                conn.outbox = conn.outbox[conn.sock.send(conn.outbox) :]
        except BlockingIOError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except OSError:
            self._close(conn)
            return
        if conn.keep:
            self._next_request(conn)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = LINGERING
        self._deadlines.set(conn, time.monotonic() + LINGER)
        self._watch(conn, selectors.EVENT_READ)

    def _next_request(self, conn: Connection) -> None:
        """Readies a kept connection for its next request (which may have arrived already)."""
        conn.state, conn.keep, conn.idle = READING, False, not conn.inbox
        conn.environ, conn.then = {}, None
        timeout = self._keep_alive_timeout if conn.idle else self._head_timeout
        self._deadlines.set(conn, time.monotonic() + timeout)
        self._watch(conn, selectors.EVENT_READ)
        if conn.inbox:
            self._take_head(conn)

    def _watch(self, conn: Connection, events: int) -> None:
        try:
            self._selector.modify(conn.sock, events, conn)
        except KeyError:
            self._selector.register(conn.sock, events, conn)

    def _unwatch(self, conn: Connection) -> None:
        try:
            self._selector.unregister(conn.sock)
        except KeyError:
            pass

    def _close(self, conn: Connection) -> None:
        if conn not in self._connections:
            return
        if conn.state == PARKED:
            self._unpark(conn)
        conn.state = LINGERING
        self._connections.pop(conn, None)
        self._unwatch(conn)
        conn.sock.close()

    def _wake(self) -> None:
        try:
            self._wake_out.send(b"\0")
        except OSError:  # the buffer is full (a wake-up is pending anyway) or the loop is gone
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_in.recv(4096):
                pass
        except OSError:
            pass

    def _unpark(self, conn: Connection) -> None:
        conn.then = None
        self._workers.slots.give_back()

    def _thread_started(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start(threading.get_ident())
        own_thread()

    def _thread_exited(self) -> None:
        if self._on_thread_exit is not None:
            self._on_thread_exit(threading.get_ident())
