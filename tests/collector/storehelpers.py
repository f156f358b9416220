"""Helpers for the store, query and rollup tests: a migrated store on each engine, row makers."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator

import pytest

from collector.store import SampleRow, Store

T0 = 1_700_000_000 // 86400 * 86400  # a UTC midnight, so every tier boundary falls on it


def row(
    bucket: int,
    stack: str,
    count: int,
    *,
    mode: str = "cpu",
    service: str = "api",
    host: str = "web-1",
    instance: str = "i-1",
    labels: dict[str, str] | None = None,
    interval: float = 0.01,
) -> SampleRow:
    """Returns a sample row with sensible defaults."""
    return SampleRow(bucket, mode, service, host, instance, labels or {}, stack, count, interval)


def sparse_rows(
    start: int,
    end: int,
    every: int,
    instances: list[dict],
    *,
    stacks: list[str],
    seed: int,
    most: int = 50,
) -> list[SampleRow]:
    """Returns a row every ``every`` seconds of [start, end) for each of ``instances``
    (row() keywords), each of a random stack and route label, with 1 to ``most`` samples."""
    rng = random.Random(seed)
    rows = []
    for bucket in range(start - start % 60, end, every):
        bucket -= bucket % 60
        for instance in instances:
            labels = {"route": rng.choice(["/a", "/b"])}
            stack, count = rng.choice(stacks), rng.randint(1, most)
            rows.append(row(bucket, stack, count, labels=labels, **instance))
    return rows


def write_all(store: Store, rows: list[SampleRow], piece: int = 2000) -> None:
    """Writes rows a piece at a time, as a collector does round by round."""
    for i in range(0, len(rows), piece):
        store.write(rows[i : i + piece])


@pytest.fixture(name="store")
def store_fixture(migrated_db_url: str) -> Iterator[Store]:
    """A migrated store on each engine in turn, closed afterwards."""
    st = Store(migrated_db_url)
    st.migrate()  # nothing to do: as a collector starts on a migrated database
    try:
        yield st
    finally:
        st.close()


class TcpProxy:
    """Forwards a local port to another address; stopping it is a real network outage."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Starts accepting connections on self.port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Closes the listener and cuts every forwarded connection."""
        if self._listener is not None:
            try:  # wakes the accepting thread on Linux, which close() alone does not
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
