"""Fetches targets' /profile.json on a bounded thread pool, each fetch bounded in time and size.

One kept-alive connection per target is reused from poll to poll (the sampler keeps a
connection open when asked with ``Connection: keep-alive``), and answers come gzipped when
the target offers it. Each fetch has a connect timeout, a per-read timeout, an overall
deadline (checked between reads, and enforced by collector.deadlines, which shuts the socket
down at it: a target dripping its answer's head cannot outlast it), and a cap on the decoded
body: a slow, dead or hostile target costs one pool thread for at most about
``fetch_deadline`` seconds (``connect_timeout`` if that is longer) and never delays the other
targets' results.

It speaks HTTP through the standard library's ``http.client``: a fetch through ``requests``
cost about 1.3 ms of CPU, five times as much, which at 500 targets was most of a round's CPU.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import resource
import socket
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collector.deadlines import Deadlines
from collector.targets import Target
from sampler.profile import Document, DocumentError, Limits, decode_document

__all__ = ["FetchError", "PollResult", "Poller"]

_CHUNK = 256 * 1024
# A connection the target closed while idle fails at once on reuse: try once more afresh.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class FetchError(Exception):
    """A target could not be fetched; ``reason`` is a short machine-readable kind."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Closed(FetchError):
    """The target closed the connection before answering (a kept one may just be stale)."""


@dataclass
class PollResult:
    """One target's outcome: a validated profile or an error, and what the fetch cost.

    Whoever consumes the profile sets it to None once done, so a decoded document (a few
    megabytes for a large one) is not kept alive while the poll waits for the writer.
    """

    target: Target
    profile: Document | None
    reason: str  # "ok", or the failure kind: refused, timeout, dns, http, too_large, invalid, ...
    error: str
    seconds: float
    nbytes: int  # bytes received (compressed, when the answer was)
    cpu_seconds: float = 0.0  # CPU the fetch and decoding took on its thread

    @property
    def ok(self) -> bool:
        """Whether a valid profile was fetched."""
        return self.profile is not None


def _idle_limit() -> int:
    # Each kept connection holds a file descriptor: keep at most half of what the process
    # may open, so a large fleet under a small limit reconnects instead of failing.
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 100_000 if soft == resource.RLIM_INFINITY else max(0, soft // 2 - 64)


class Poller:
    """Polls targets on a bounded thread pool over kept-alive HTTP connections."""

    def __init__(
        self,
        *,
        concurrency: int = 32,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        deadline: float = 8.0,
        max_bytes: int = 64 * 1024 * 1024,
        limits: Limits | None = None,
        token: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.concurrency = concurrency
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.limits = limits or Limits()
        self._clock = clock
        self._headers = {
            "User-Agent": "fleetflame-collector",
            "Accept-Encoding": "gzip",
            "Connection": "keep-alive",
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._idle: dict[str, http.client.HTTPConnection] = {}  # address -> kept connection
        self._max_idle = _idle_limit()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="fleetflame-poll"
        )
        self._deadlines = Deadlines()

    @property
    def kept_connections(self) -> int:
        """Connections kept open for the next poll."""
        return len(self._idle)

    def fetch(self, target: Target, query: str = "") -> tuple[bytes, int]:
        """Returns a target's decoded body and the bytes received; raises FetchError."""
        started = self._clock()
        watch = self._deadlines.start(self.deadline)
        conn = None
        try:
            kept = self._idle.pop(target.address, None)
            conn = kept or self._connect(target)
            self._deadlines.follow(watch, conn.sock)
            try:
                response = self._ask(conn, "/profile.json" + query)
            except _Closed:
                if kept is None or watch.cut:
                    raise
                conn.close()
                conn = self._connect(target)
                self._deadlines.follow(watch, conn.sock)
                response = self._ask(conn, "/profile.json" + query)
            body, received = self._read(response, started)
            if self._deadlines.end(watch):  # cut just as it ended: the connection is shut
                raise FetchError("timeout", f"not complete after {self.deadline} s")
        except BaseException as exc:
            cut = self._deadlines.end(watch)
            if conn is not None:
                conn.close()
            timed_out = isinstance(exc, FetchError) and exc.reason == "timeout"
            if cut and isinstance(exc, Exception) and not timed_out:
                raise FetchError("timeout", f"not complete after {self.deadline} s") from None
            raise
        if response.will_close or len(self._idle) >= self._max_idle:
            conn.close()
        else:
            self._idle[target.address] = conn
        return body, received

    def _connect(self, target: Target) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except socket.gaierror as exc:
            raise FetchError("dns", f"DNS lookup failed: {exc}") from None
        except ConnectionRefusedError:
            raise FetchError("refused", "connection refused") from None
        except TimeoutError:
            raise FetchError(
                "timeout", f"connect timed out after {self.connect_timeout} s"
            ) from None
        except OSError as exc:
            raise FetchError("connection", f"connection failed: {_short(exc)}") from None
        assert conn.sock is not None
        conn.sock.settimeout(self.read_timeout)
        return conn

    def _ask(self, conn: http.client.HTTPConnection, path: str) -> http.client.HTTPResponse:
        try:
            conn.request("GET", path, headers=self._headers)
            return conn.getresponse()
        except _STALE as exc:
            raise _Closed("connection", f"closed without an answer: {_short(exc)}") from None
        except TimeoutError:
            raise FetchError("timeout", f"no response within {self.read_timeout} s") from None
        except (http.client.HTTPException, OSError) as exc:
            raise FetchError("http", f"request failed: {_short(exc)}") from None

    def _read(self, response: http.client.HTTPResponse, started: float) -> tuple[bytes, int]:
        if response.status != 200:
            snippet = response.read(200) if not _gzipped(response) else b""
            text = snippet.decode("utf-8", "replace").strip().splitlines()
            raise FetchError("http", f"HTTP {response.status}: {text[0][:120] if text else ''}")
        declared = response.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchError(
                "too_large", f"Content-Length {declared} over the {self.max_bytes} byte cap"
            )
        decoder = zlib.decompressobj(31) if _gzipped(response) else None
        chunks: list[bytes] = []
        size = received = 0
        try:
            # read1 returns whatever arrived, so the deadline is checked even when a target
            # drips one byte at a time (a plain read(n) would wait for n bytes).
            while chunk := response.read1(_CHUNK):
                received += len(chunk)
                if decoder is not None:
                    # At most one byte past the cap: a gzip bomb is never inflated whole.
                    chunk = decoder.decompress(chunk, self.max_bytes - size + 1)
                size += len(chunk)
                if size > self.max_bytes:
                    raise FetchError("too_large", f"body over the {self.max_bytes} byte cap")
                chunks.append(chunk)
                if self._clock() - started > self.deadline:
                    raise FetchError("timeout", f"body not complete after {self.deadline} s")
            response.read()  # marks the answer complete, so the connection can be reused
        except TimeoutError:
            raise FetchError("timeout", "reading the body failed: timed out") from None
        except (http.client.HTTPException, OSError, zlib.error) as exc:
            raise FetchError("broken", f"reading the body failed: {_short(exc)}") from None
        if response.length:  # the target closed before sending what it announced
            raise FetchError("broken", f"the body ended {response.length} bytes short")
        if decoder is not None and not decoder.eof:
            raise FetchError("broken", "the gzip stream ended early")
        return b"".join(chunks), received

    def poll_one(self, target: Target, query: str = "") -> PollResult:
        """Fetches and validates one target (``query`` appended to its URL); never raises."""
        started, cpu = self._clock(), time.thread_time()
        received = 0
        try:
            raw, received = self.fetch(target, query)
            profile = decode_document(raw, self.limits)
        except (FetchError, DocumentError) as exc:
            reason = exc.reason if isinstance(exc, FetchError) else "invalid"
            profile, error = None, str(exc)
        except Exception as exc:  # a bug must cost one target, not the round
            reason, profile, error = "error", None, f"{type(exc).__name__}: {exc}"
        else:
            reason, error = "ok", ""
        seconds, cpu = self._clock() - started, time.thread_time() - cpu
        return PollResult(target, profile, reason, error, seconds, received, cpu)

    def submit(
        self, target: Target, query: str, then: Callable[[PollResult], None]
    ) -> concurrent.futures.Future[None]:
        """Polls one target on the pool and calls ``then`` with its result on the same thread."""
        return self._pool.submit(lambda: then(self.poll_one(target, query)))

    def poll(
        self,
        targets: Sequence[Target],
        on_result: Callable[[PollResult], None] | None = None,
        query: Callable[[Target], str] | None = None,
    ) -> list[PollResult]:
        """Polls all targets concurrently and waits; results come back in completion order.

        ``query`` gives the query string of each target's request (see TargetState.since_query).
        """
        futures = [
            self._pool.submit(self.poll_one, target, query(target) if query else "")
            for target in targets
        ]
        results = []
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    def close(self) -> None:
        """Stops the pool threads (letting running fetches end) and closes kept connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._deadlines.stop()
        while self._idle:
            _address, conn = self._idle.popitem()
            conn.close()


def _gzipped(response: http.client.HTTPResponse) -> bool:
    return (response.getheader("Content-Encoding") or "").strip().lower() == "gzip"


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:197] + "..."
