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
from collections.abc import Iterator
from contextlib import contextmanager
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

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_GET(self) -> None:  # noqa: N802
        server = self.server
        with server.lock:
            server.requests += 1
            server.paths.append(self.path)
            server.times.append(time.monotonic())
            server.active += 1
            server.most_active = max(server.most_active, server.active)
        try:
            self._answer(server.behaviour)
        finally:
            with server.lock:
                server.active -= 1

    def _answer(self, behaviour: Any) -> None:
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
        self.times: list[float] = []  # when each request arrived (time.monotonic)
        self.connections = 0  # TCP connections accepted
        self.active = 0  # requests being answered now
        self.most_active = 0
        self.lock = threading.Lock()
        self.port = self.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1})
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


class Fleet:
    """Many /profile.json servers on one asyncio thread: a fleet of real targets for scale tests.

    Target ``i`` serves ``make_doc(stacks(i), instance=f"f{i}")`` over kept-alive HTTP/1.1,
    whole whatever the query (``since`` 0), which a collector reads like any answer.
    """

    def __init__(self, size: int, stacks) -> None:
        import asyncio

        self.docs = [
            json.dumps(make_doc(stacks(i), instance=f"f{i:05d}")).encode() for i in range(size)
        ]
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="test-fleet")
        self._thread.start()
        ready.wait(60)
        self.addresses = [f"127.0.0.1:{port}" for port in self._ports]

    def _run(self, ready: threading.Event) -> None:
        import asyncio
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_poll", ROOT / "bench/bench_poll.py")
        assert spec is not None and spec.loader is not None
        bench_poll = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_poll)

        def answer(index: int, _request: bytes) -> tuple[bytes, bool]:
            self.requests += 1
            return self.docs[index], False

        asyncio.set_event_loop(self._loop)
        self._servers = self._loop.run_until_complete(
            bench_poll.serve_fleet(len(self.docs), answer)
        )
        self._ports = [server.sockets[0].getsockname()[1] for server in self._servers]
        ready.set()
        self._loop.run_forever()
        for server in self._servers:
            server.close()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


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


def drip_head(release: threading.Event, interval: float = 0.3):
    """A behaviour sending its answer's head one byte at a time (each read is quick, and the
    head never ends): no socket timeout can stop it."""

    def behave(handler: BaseHTTPRequestHandler) -> None:
        head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 10_000
        try:
            for byte in head:
                if release.wait(interval):
                    break
                handler.wfile.write(bytes([byte]))
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


def gzipped(body: bytes, *, declare: bool = True):
    """A behaviour answering ``body`` gzip-encoded, as the sampler does for a collector."""
    import gzip as gzip_module

    packed = gzip_module.compress(body, compresslevel=1)

    def behave(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Encoding", "gzip")
        if declare:
            handler.send_header("Content-Length", str(len(packed)))
        handler.end_headers()
        handler.wfile.write(packed)
        if not declare:
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
import os, sys, threading, time
import sampler

def leaf_a(n):
    return sum(i * i for i in range(n))

def leaf_b(n):
    return sorted(range(n, 0, -1))[0]

def work(stop_file):
    # The stop file is looked for every 50 ms, not at every turn of the loop: a main thread
    # that lets the GIL go and takes it back every few milliseconds (a stat) starves the
    # endpoint's threads of it for seconds (CPython's GIL; docs/sampler.md, Limits).
    look_at = 0.0
    while True:
        now = time.monotonic()
        if now >= look_at:
            if os.path.exists(stop_file):
                return
            look_at = now + 0.05
        leaf_a(20000)
        leaf_b(20000)

s = sampler.start(port=0, service=sys.argv[1], labels={"role": "test"}, interval=0.005)
print(s.server.port, flush=True)
stop_file = sys.argv[2]
with sampler.tag(route="/busy"):
    work(stop_file)
# Idle: in cpu mode a thread that uses no CPU takes no samples, so its counts stay still. Not a
# loop of sleeps: each wake-up uses some CPU, and the thread's CPU timer, part way to its next
# tick when the work stopped, fires once they add up (a sample after the test's final read).
threading.Event().wait()
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


@contextmanager
def ready_worker(script: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Runs ``script`` with a free port as its argument until it prints "ready"; yields the
    process and the port, and kills the process on the way out."""
    port = closed_port()
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process, port
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


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
        # The worst-cases and findings jobs read the targets too: off unless a test asks, so
        # the polling tests count polls only (test_worst.py and test_findings.py run them).
        "worst_interval": 0.0,
        "findings_interval": 0.0,
        **changes,
    }
    return load_settings(environ={}).replace(**values)


def migrated_collector(db_url: str, targets=(), **changes: Any):
    """A collector of ``collector_settings`` on a database brought up to date."""
    from collector.service import Collector

    c = Collector(collector_settings(db_url, targets, **changes))
    c.migrate()
    return c


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
