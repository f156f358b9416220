"""Shared helpers for the collector's polling tests: documents, hostile servers, workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def make_doc(
    stacks,
    *,
    instance: str = "a1",
    label_sets: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    mode: str = "cpu",
    now: float = 1_795_423_812.5,
) -> dict[str, Any]:
    """Returns a /profile.json document with the given [label_set, stack, count] entries."""
    stacks = [list(entry) for entry in stacks]
    return {
        "format": "fleetflame.profile/1",
        "instance": {"id": instance, "pid": 4242, "start_time": now - 600, "host": "web-3"},
        "labels": dict(labels if labels is not None else {"service": "api", "host": "web-3"}),
        "mode": mode,
        "interval": 0.01,
        "effective_interval": 0.01,
        "time": now,
        "total_samples": sum(entry[2] for entry in stacks),
        "dropped_samples": 0,
        "label_sets": label_sets if label_sets is not None else [{}],
        "stacks": stacks,
    }


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Polls ``predicate`` until it returns a true value, which it returns."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Servers: a controllable /profile.json server and hostile behaviours, on real sockets.


ROOT = Path(__file__).resolve().parents[2]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DocServer

    def do_GET(self) -> None:  # noqa: N802
        self.server.requests += 1
        self.server.paths.append(self.path)
        behaviour = self.server.behaviour
        if callable(behaviour):
            behaviour(self)
            return
        body = json.dumps(self.server.doc).encode() if behaviour == "ok" else behaviour
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class DocServer(ThreadingHTTPServer):
    """Serves ``doc`` as /profile.json, or misbehaves as ``behaviour`` says (bytes or a callable)."""

    daemon_threads = True

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.doc = doc if doc is not None else make_doc([(0, "a;b", 1)])
        self.behaviour: Any = "ok"
        self.requests = 0
        self.paths: list[str] = []
        self.port = self.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1})
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


def send_status(status: int, body: bytes = b"boom\n"):
    """A behaviour answering ``status`` with a text body."""

    def behave(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return behave


def hang_mid_response(release: threading.Event):
    """A behaviour sending headers and half a body, then stalling until ``release`` is set."""

    def behave(handler: BaseHTTPRequestHandler) -> None:
        body = json.dumps(handler.server.doc).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        release.wait(60)
        handler.close_connection = True

    return behave


def drip(release: threading.Event, interval: float = 0.2):
    """A behaviour sending an endless body one byte at a time (each read is quick, the whole is not)."""

    def behave(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            while not release.wait(interval):
                handler.wfile.write(b"1\r\n \r\n")
                handler.wfile.flush()
        except OSError:
            pass
        handler.close_connection = True

    return behave


def gigantic(chunk_mb: int = 1, total_mb: int = 512, declare: bool = False):
    """A behaviour streaming a huge chunked (or declared-length) body of JSON-ish bytes."""

    def behave(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        chunk = b"[" * (chunk_mb * 1024 * 1024)
        if declare:
            handler.send_header("Content-Length", str(total_mb * 1024 * 1024))
        else:
            handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            for _ in range(total_mb // chunk_mb):
                if declare:
                    handler.wfile.write(chunk)
                else:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if not declare:
                handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the collector hung up past its cap: exactly what should happen
        handler.close_connection = True

    return behave


def closed_port() -> int:
    """Returns a port on 127.0.0.1 that nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Real workers: subprocesses running the real sampler and burning CPU in known functions.

WORKER_SCRIPT = r"""
import os, sys, time
import sampler

def leaf_a(n):
    return sum(i * i for i in range(n))

def leaf_b(n):
    return sorted(range(n, 0, -1))[0]

def work(stop_file):
    while not os.path.exists(stop_file):
        leaf_a(20000)
        leaf_b(20000)

s = sampler.start(port=0, service=sys.argv[1], labels={"role": "test"}, interval=0.005)
print(s.server.port, flush=True)
stop_file = sys.argv[2]
with sampler.tag(route="/busy"):
    work(stop_file)
# Idle: in cpu mode a sleeping process takes no samples, so its counts stay still.
while True:
    time.sleep(1)
"""


class Worker:
    """A real worker process running the sampler; ``idle()`` stops its CPU work for exact counts."""

    def __init__(self, tmp_path: Path, service: str = "api", name: str = "w") -> None:
        self.stop_file = tmp_path / f"{name}-{os.getpid()}-{id(self)}.stop"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, service, str(self.stop_file)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.kill()
            raise RuntimeError(f"worker did not start: {line!r}")
        self.port = int(line)
        self.address = f"127.0.0.1:{self.port}"

    def profile(self) -> dict[str, Any]:
        import requests

        return requests.get(f"http://{self.address}/profile.json", timeout=10).json()

    def idle(self) -> dict[str, Any]:
        """Stops the CPU work and returns the profile once its counts stopped changing."""
        self.stop_file.write_text("")
        last = None

        def settled():
            nonlocal last
            doc = self.profile()
            same = last is not None and doc["total_samples"] == last["total_samples"]
            last = doc
            return doc if same else None

        return wait_until(settled, timeout=30, interval=0.5, what="worker counts to settle")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


def folded_by_instance(doc: dict[str, Any]) -> dict[str, int]:
    """Merges a /profile.json document's stacks over label sets."""
    counts: dict[str, int] = {}
    for _index, stack, count in doc["stacks"]:
        counts[stack] = counts.get(stack, 0) + count
    return counts


def collector_settings(db_url: str, targets=(), **changes: Any):
    """Settings for an in-process collector in a test: fast timeouts, no health port unless asked."""
    from collector.settings import load_settings

    values = {
        "database_url": db_url,
        "targets": list(targets),
        "connect_timeout": 1.0,
        "read_timeout": 2.0,
        "fetch_deadline": 4.0,
        "poll_interval": 1.0,
        "health_listen": "",
        "db_busy_timeout": 1.0,
        **changes,
    }
    return load_settings(environ={}).replace(**values)


def stored(db_url: str, instance: str | None = None, mode: str = "cpu") -> dict[str, int]:
    """Returns the folded counts the database holds (for one instance, or all), over all time."""
    from collector.query import Filters, Query
    from collector.store import Store

    store = Store(db_url)
    try:
        filters = Filters(mode=mode, instances=(instance,) if instance else ())
        now = int(time.time())
        return Query(store).profile(
            now - now % 3600 - 3 * 3600, now - now % 3600 + 3 * 3600, filters
        )
    finally:
        store.close()


class CapturedLog:
    """Collects formatted key=value log lines of the collector's loggers."""

    def __init__(self) -> None:
        import logging

        from collector.logs import KeyValueFormatter

        self.lines: list[str] = []
        self._handler = logging.Handler(level=logging.DEBUG)
        formatter = KeyValueFormatter()
        self._handler.emit = lambda record: self.lines.append(formatter.format(record))  # type: ignore[method-assign]
        self._logger = logging.getLogger("collector")
        self._old_level = self._logger.level
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.DEBUG)

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._old_level)

    def matching(self, *parts: str) -> list[str]:
        """Returns the lines containing every one of ``parts``."""
        return [line for line in self.lines if all(part in line for part in parts)]


class TcpProxy:
    """A TCP forwarder on a fixed local port that can be taken down and brought back.

    Taking it down closes the listening socket and every forwarded connection, so a client of
    the real server behind it sees exactly what it would see if that server were unreachable,
    while the server itself (shared with other users) is never touched.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = closed_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the
            # kernel socket listening until that accept() returned.
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def url(self, pg_url: str) -> str:
        """Rewrites a PostgreSQL URL on 127.0.0.1:5432 to go through this proxy."""
        return pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{self.port}")

    def close(self) -> None:
        self.down()
