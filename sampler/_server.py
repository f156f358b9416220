"""The sampler's HTTP endpoint: a WSGI app, served by a threaded stdlib server on a daemon thread.

The app is plain WSGI, so a host can also mount it in its own server
(``sampler.make_wsgi_app()``). Request threads are excluded from the profile, a cap on
concurrent requests answers 503 past it, and sockets time out, so a slow or hostile client
costs a thread for a few seconds at most and never touches the sampling.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from . import _svg

MAX_CONCURRENT = 8
MAX_SECONDS = 300
SOCKET_TIMEOUT = 10.0

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
    """The WSGI app behind the endpoint."""

    def __init__(
        self,
        sampler: ProfileSource,
        token: str | None = None,
        on_thread: Callable[[int], None] | None = None,
        off_thread: Callable[[int], None] | None = None,
    ) -> None:
        self.sampler = sampler
        self.token = token
        self._on_thread = on_thread
        self._off_thread = off_thread
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        ident = threading.get_ident()
        if self._on_thread:
            self._on_thread(ident)
        try:
            if not self._slots.acquire(blocking=False):
                return self._error(
                    start_response,
                    HTTPError("503 Service Unavailable", "too many concurrent requests"),
                )
            try:
                content_type, body = self._route(environ)
            finally:
                self._slots.release()
        except HTTPError as exc:
            return self._error(start_response, exc)
        finally:
            if self._off_thread:
                self._off_thread(ident)
        start_response(
            "200 OK",
            [
                ("Content-Type", content_type),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [body]

    def _error(self, start_response: StartResponse, exc: HTTPError) -> Iterable[bytes]:
        body = (str(exc) + "\n").encode()
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ]
        if exc.status.startswith("401"):
            headers.append(("WWW-Authenticate", 'Bearer realm="fleetflame"'))
        start_response(exc.status, headers)
        return [body]

    def _route(self, environ: dict[str, Any]) -> tuple[str, bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            raise HTTPError("405 Method Not Allowed", "only GET is supported")
        if self.token is not None:
            sent = environ.get("HTTP_AUTHORIZATION", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
                raise HTTPError("401 Unauthorized", "missing or wrong bearer token")
        path = environ.get("PATH_INFO", "/")
        query = _query(environ.get("QUERY_STRING", ""))
        sampler = self.sampler
        if path in ("/", "/stacks"):
            return "text/plain; charset=utf-8", sampler.folded_text(_seconds(query))
        if path == "/flamegraph.svg":
            seconds = _seconds(query)
            counts = sampler.folded_for(seconds) if seconds else sampler.folded()
            title = query.get("title") or f"{sampler.labels['service']} ({sampler.mode})"
            svg = _svg.render(counts, title=title, unit_seconds=sampler.interval, mode=sampler.mode)
            return "image/svg+xml", svg.encode()
        if path == "/profile.json":
            return "application/json", sampler.profile_json(
                _since(query), query.get("instance", "")
            )
        if path == "/info":
            return "application/json", json.dumps(sampler.info(), indent=2).encode()
        raise HTTPError(
            "404 Not Found",
            f"no such endpoint {path[:100]!r}; try /stacks, "
            "/flamegraph.svg, /profile.json or /info",
        )


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
    if "seconds" not in query:
        return 0.0
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


class _QuietHandler(WSGIRequestHandler):
    timeout = SOCKET_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


class _Server6(_Server):
    address_family = socket.AF_INET6


class Endpoint:
    """A running endpoint: its server, its thread, and its URL."""

    def __init__(self, server: _Server, host: str) -> None:
        self._server = server
        self.port = server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="fleetflame-endpoint",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops serving and releases the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def close_inherited(self) -> None:
        """Closes the listening socket a forked child inherited (its serving thread is gone)."""
        self._server.socket.close()


def start_server(
    sampler: Any,
    host: str,
    ports: tuple[int, int],
    token: str | None,
    exclude_thread: Callable[[int], None],
) -> Endpoint:
    """Serves the sampler on the first free port of ``ports``; raises SamplerError if none is."""
    from ._core import SamplerError

    excluded: set[int] = sampler._excluded
    app = SamplerApp(sampler, token, exclude_thread, excluded.discard)
    low, high = ports
    last_error: OSError | None = None
    for port in range(low, high + 1):
        try:
            server_class = _Server6 if ":" in host else _Server
            server = server_class((host, port), _QuietHandler)
        except OSError as exc:
            last_error = exc
            continue
        server.set_app(app)
        endpoint = Endpoint(server, host)
        exclude_thread(endpoint._thread.ident or 0)
        return endpoint
    where = f"port {low}" if low == high else f"ports {low}-{high}"
    raise SamplerError(
        f"cannot serve the sampler endpoint on {host} {where}: {last_error}; "
        "use a free port, a range (FLEETFLAME_PORT=8021-8036) or port='none'"
    )


def make_wsgi_app(sampler: Any = None, token: str | None = None) -> SamplerApp:
    """Returns a WSGI app serving the running (or given) sampler, to mount in your own server."""
    from ._core import SamplerError, running

    sampler = sampler or running()
    if sampler is None:
        raise SamplerError("no sampler is running: call sampler.start(port='none') first")
    return SamplerApp(sampler, token, sampler._excluded.add, sampler._excluded.discard)
