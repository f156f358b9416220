"""The sampler's HTTP endpoint: a WSGI app, served by ``_http.Server`` on daemon threads.

The app is plain WSGI, so a host can also mount it in its own server
(``sampler.make_wsgi_app()``). Served by ``start_server``, it runs on a fixed pool of threads
excluded from the profile, and a long read (``?seconds=N``) holds no thread while it waits:
its first snapshot is taken at once and the request is parked in the server's event loop
until the second. In a host's server a long read waits on its thread instead, and at most
``MAX_LONG_BLOCKING`` do so at once, so they never take every slot of the quick reads.

Answers of ``GZIP_MIN_BYTES`` or more are gzipped for a client that accepts it (a collector
does): a document of 2,000 stacks shrinks about five times, for ~4 ms of CPU a megabyte.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import parse_qs

from . import _dump, _http, _svg
from ._core import Sampler, SamplerError
from .profile import format_folded, subtract

log = logging.getLogger("sampler")

MAX_CONCURRENT = 8
MAX_LONG_BLOCKING = 4
MAX_SECONDS = 300
GZIP_MIN_BYTES = 1024
# A forked child whose single port the parent holds serves on the next free one of these.
CHILD_PORT_TRIES = 64
ROUTES = "/stacks, /flamegraph.svg, /profile.json, /info, /stalls.json, /requests.json or /dump"

StartResponse = Callable[..., Any]


class HTTPError(Exception):
    """An error answered to the client with a status and a one-line message."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class ProfileSource(Protocol):
    """What the endpoint serves: the sampler, or anything shaped like it (fleetflame attach)."""

    labels: dict[str, str]
    mode: str
    interval: float

    def folded(self) -> dict[str, int]: ...
    def folded_for(self, seconds: float) -> dict[str, int]: ...
    def folded_text(self, seconds: float = 0.0) -> bytes: ...
    def profile_json(self, since: int = 0, instance: str = "") -> bytes: ...
    def info(self) -> dict[str, Any]: ...


class SamplerApp:
    """The WSGI app behind the endpoint.

    ``on_thread``/``off_thread`` exclude the calling thread from the profile during a request
    (a host's server); ``own_threads`` are the sampler's own threads, left out of ``/dump``,
    which is served only when it is given (the source samples this process).
    """

    def __init__(
        self,
        sampler: ProfileSource,
        token: str | None = None,
        on_thread: Callable[[int], None] | None = None,
        off_thread: Callable[[int], None] | None = None,
        own_threads: Collection[int] | None = None,
    ) -> None:
        self.sampler = sampler
        self.token = token
        self._on_thread = on_thread
        self._off_thread = off_thread
        self._own_threads = own_threads
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._long_slots = threading.BoundedSemaphore(MAX_LONG_BLOCKING)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        with self._excluded():
            try:
                return self._answer(environ, start_response)
            except HTTPError as exc:
                return _error(start_response, exc)

    @contextmanager
    def _excluded(self) -> Iterator[None]:
        ident = threading.get_ident()
        if self._on_thread:
            self._on_thread(ident)
        try:
            yield
        finally:
            if self._off_thread:
                self._off_thread(ident)

    def _answer(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            raise HTTPError("405 Method Not Allowed", "only GET is supported")
        if self.token is not None:
            sent = environ.get("HTTP_AUTHORIZATION", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
                raise HTTPError("401 Unauthorized", "missing or wrong bearer token")
        path = environ.get("PATH_INFO", "/")
        query = _query(environ.get("QUERY_STRING", ""))
        if path in ("/", "/stacks", "/flamegraph.svg") and "seconds" in query:
            return self._window(environ, start_response, path, query, _seconds(query))
        if not self._slots.acquire(blocking=False):
            raise HTTPError("503 Service Unavailable", "too many concurrent requests")
        try:
            content_type, body = self._route(path, query)
        finally:
            self._slots.release()
        return _ok(start_response, content_type, body, environ)

    def _route(self, path: str, query: dict[str, str]) -> tuple[str, bytes]:
        sampler = self.sampler
        if path in ("/", "/stacks"):
            return "text/plain; charset=utf-8", sampler.folded_text()
        if path == "/flamegraph.svg":
            return self._svg(query, sampler.folded())
        if path == "/profile.json":
            return "application/json", sampler.profile_json(
                _since(query), query.get("instance", "")
            )
        if path == "/info":
            return "application/json", json.dumps(sampler.info(), indent=2).encode()
        if path == "/stalls.json":
            stalls = getattr(sampler, "stalls", None)
            if stalls is None:
                raise HTTPError("404 Not Found", "this endpoint does not watch for stalls")
            document = stalls.document(_since(query))
            # Whose stalls: ids start over with each process (and fork), as instances do.
            instance = getattr(sampler, "instance", None) or {}
            document.update(instance=instance.get("id"), labels=sampler.labels)
            return "application/json", json.dumps(document).encode()
        if path == "/requests.json" and self._own_threads is not None:
            from ._requests import recorder  # the middleware's counts, in this process

            return "application/json", json.dumps(recorder.document()).encode()
        if path == "/dump" and self._own_threads is not None:
            return self._dump(query)
        if path == "/dump":
            raise HTTPError(
                "404 Not Found",
                "/dump is served by the sampler inside a process; this endpoint reads another",
            )
        raise HTTPError("404 Not Found", f"no such endpoint {path[:100]!r}; try {ROUTES}")

    def _window(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        path: str,
        query: dict[str, str],
        seconds: float,
    ) -> Iterable[bytes]:
        """Answers a read of the next ``seconds``: parked in the server when it can park."""
        park: _http.Park | None = environ.get(_http.PARK)
        if park is None:
            if not self._long_slots.acquire(blocking=False):
                raise HTTPError(
                    "503 Service Unavailable",
                    f"too many reads of ?seconds=N at once (at most {MAX_LONG_BLOCKING})",
                )
            try:
                counts = self.sampler.folded_for(seconds)
            finally:
                self._long_slots.release()
            return _ok(start_response, *self._render_window(path, query, counts), environ)
        window_end: list[Callable[[], dict[str, int]]] = []

        def then(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            with self._excluded():
                rendered = self._render_window(path, query, window_end[0]())
                return _ok(start_response, *rendered, environ)

        parked = park(seconds, then)
        if parked is None:
            raise HTTPError(
                "503 Service Unavailable",
                "too many reads of ?seconds=N waiting; retry when one has answered",
            )
        # Read only once parked, so a refused read costs no snapshot; ``then`` cannot run
        # before this app returns.
        window_end.append(_window_start(self.sampler))
        return parked

    def _render_window(
        self, path: str, query: dict[str, str], counts: dict[str, int]
    ) -> tuple[str, bytes]:
        if path == "/flamegraph.svg":
            return self._svg(query, counts)
        return "text/plain; charset=utf-8", format_folded(counts).encode()

    def _svg(self, query: dict[str, str], counts: dict[str, int]) -> tuple[str, bytes]:
        sampler = self.sampler
        title = query.get("title") or f"{sampler.labels['service']} ({sampler.mode})"
        svg = _svg.render(counts, title=title, unit_seconds=sampler.interval, mode=sampler.mode)
        return "image/svg+xml", svg.encode()

    def _dump(self, query: dict[str, str]) -> tuple[str, bytes]:
        form = query.get("format", "text")
        if form not in ("text", "json"):
            raise HTTPError("400 Bad Request", f"format must be text or json, got {form[:20]!r}")
        threads = _dump.take(self._own_threads or ())
        if form == "json":
            return "application/json", _dump.render_json(threads, os.getpid(), time.time())
        return "text/plain; charset=utf-8", _dump.render_text(threads, os.getpid()).encode()


def _window_start(source: ProfileSource) -> Callable[[], dict[str, int]]:
    """Reads ``source`` now; returns a function giving what it counted from now until called."""
    if isinstance(source, Sampler):
        # The sampler's own snapshot shares its keys with the table: a parked read keeps a
        # dict of floats, not a copy of the folded text.
        before, table = source._snapshot(), source.table

        def sampler_end() -> dict[str, int]:
            after = source._snapshot()
            if source.table is not table:  # the process forked meanwhile: all is new
                return source.folded(after)
            return source.folded({key: n - before.get(key, 0) for key, n in after.items()})

        return sampler_end
    first = source.folded()
    return lambda: subtract(source.folded(), first)


def _ok(
    start_response: StartResponse, content_type: str, body: bytes, environ: dict[str, Any]
) -> list[bytes]:
    headers = [("Content-Type", content_type), ("Cache-Control", "no-store")]
    if len(body) >= GZIP_MIN_BYTES:
        headers.append(("Vary", "Accept-Encoding"))
        if accepts_gzip(environ.get("HTTP_ACCEPT_ENCODING", "")):
            import zlib

            # Level 1: most of the size gone (stacks repeat their frames) for little CPU.
            packer = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: with a gzip header
            body = packer.compress(body) + packer.flush()
            headers.append(("Content-Encoding", "gzip"))
    headers.append(("Content-Length", str(len(body))))
    start_response("200 OK", headers)
    return [body]


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip (``gzip;q=0`` refuses it)."""
    for item in accept_encoding.split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() in ("gzip", "x-gzip"):
            quality = params.strip().lower().removeprefix("q=")
            try:
                return not params.strip() or float(quality) > 0
            except ValueError:
                return False
    return False


def _error(start_response: StartResponse, exc: HTTPError) -> list[bytes]:
    body = (str(exc) + "\n").encode()
    headers = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
    ]
    if exc.status.startswith("401"):
        headers.append(("WWW-Authenticate", 'Bearer realm="fleetflame"'))
    start_response(exc.status, headers)
    return [body]


def _query(text: str) -> dict[str, str]:
    try:
        parsed = parse_qs(text, strict_parsing=False, max_num_fields=20)
    except ValueError as exc:
        raise HTTPError("400 Bad Request", f"bad query string: {exc}") from None
    return {key: values[-1] for key, values in parsed.items()}


def _since(query: dict[str, str]) -> int:
    text = query.get("since", "0")
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise HTTPError(
            "400 Bad Request", f"since must be a tick number from /profile.json, got {text[:20]!r}"
        )
    return int(text)


def _seconds(query: dict[str, str]) -> float:
    try:
        seconds = float(query["seconds"])
    except ValueError:
        seconds = -1.0
    if not 1 <= seconds <= MAX_SECONDS:
        raise HTTPError(
            "400 Bad Request",
            f"seconds must be a number from 1 to {MAX_SECONDS}, got {query['seconds'][:20]!r}",
        )
    return seconds


def start_server(
    sampler: Any,
    host: str,
    ports: tuple[int, int],
    token: str | None,
    exclude_thread: Callable[[int], None],
    *,
    in_child: bool = False,
) -> _http.Server:
    """Serves the sampler on the first free port of ``ports``; raises SamplerError if none is.

    With ``in_child`` (a forked child) and a single port, which the parent holds, it serves
    on the next free port of the ``CHILD_PORT_TRIES`` above it, and logs which.
    """
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 address as a URL writes it
    excluded: set[int] = sampler._excluded
    app = SamplerApp(sampler, token, own_threads=excluded)
    low, high = ports
    try:
        return _serve_first_free(app, host, range(low, high + 1), exclude_thread, excluded.discard)
    except OSError as exc:
        error = exc
    if in_child and low == high != 0:
        above = range(high + 1, min(high + CHILD_PORT_TRIES, 65535) + 1)
        try:
            server = _serve_first_free(app, host, above, exclude_thread, excluded.discard)
        except OSError as exc:
            error = exc
        else:
            log.warning(
                "fleetflame sampler in child %d: port %d is taken, serving on %d",
                os.getpid(),
                low,
                server.port,
            )
            return server
    where = f"port {low}" if low == high else f"ports {low}-{high}"
    raise SamplerError(
        f"cannot serve the sampler endpoint on {host} {where}: {error}; "
        "use a free port, a range (FLEETFLAME_PORT=8021-8036) or port='none'"
    )


def _serve_first_free(
    app: SamplerApp,
    host: str,
    ports: range,
    on_thread_start: Callable[[int], None],
    on_thread_exit: Callable[[int], None],
) -> _http.Server:
    """Serves ``app`` on the first port of ``ports`` it can bind; raises the last OSError."""
    error = OSError(f"no port to try in {ports}")
    for port in ports:
        try:
            return _http.Server(
                app,
                host,
                port,
                on_thread_start=on_thread_start,
                on_thread_exit=on_thread_exit,
            )
        except OSError as exc:
            error = exc
    raise error


def make_wsgi_app(sampler: ProfileSource | None = None, token: str | None = None) -> SamplerApp:
    """Returns a WSGI app serving the running (or given) sampler, to mount in your own server."""
    from ._process import running

    source = sampler or running()
    if source is None:
        raise SamplerError("no sampler is running: call sampler.start(port='none') first")
    if not isinstance(source, Sampler):  # it reads another process: nothing here to exclude
        return SamplerApp(source, token)
    excluded = source._excluded
    return SamplerApp(source, token, excluded.add, excluded.discard, own_threads=excluded)
