"""The sampler endpoint's costs and its behaviour under hostile clients, with baselines from
the same run.

    python bench/bench_endpoint.py [--runs 21] [--requests 50]

- Cold ``import sampler`` in a fresh interpreter against ``python -c pass`` (interleaved runs,
  medians), with bytecode cached as an installed package has it (in a temporary
  ``PYTHONPYCACHEPREFIX``, whatever ``PYTHONDONTWRITEBYTECODE`` says), and what
  ``python -X importtime`` says of it and of its costliest imports.
- Stopping the endpoint: idle, and with long reads parked and dripping clients connected;
  against the stdlib's threading server stopped the way the endpoint used to be
  (``shutdown()`` of ``serve_forever(poll_interval=0.5)``).
- ``/profile.json`` latency seen by a collector over 12 s: idle, while 8 long reads
  (``/stacks?seconds=300``) are parked, and while 300 clients drip a byte a second
  (reconnecting when cut off, as an attacker would); the host's threads and RSS with them.

The host is a separate process running the sampler with defaults (a worker thread busy a
quarter of the time over about 2,000 distinct stacks), so its threads and memory are its own.
A request that arrives while that thread runs waits for the GIL (up to the 5 ms switch
interval, more than once): the p90 column shows it, the median mostly not.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOST = r"""
import sys, threading, time
import sampler

def make(digit):
    def step(rest):
        return descend(rest) if rest else sum(i * i for i in range(300))
    step.__qualname__ = f"step{digit}"
    return step

steps = [make(d) for d in range(10)]

def descend(number):
    return steps[number % 10](number // 10)

def worker():
    n = 0
    while True:  # busy a quarter of the time, as a request-serving thread may be
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            descend(1000 + n % 2000)
            n += 7
        time.sleep(0.015)

s = sampler.start(port=0, service="bench-host")
threading.Thread(target=worker, name="worker", daemon=True).start()
print(s.url, flush=True)
sys.stdin.readline()
sampler.stop()
"""


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(extra)
    return base


def timed_run(code: str, environ: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=environ)
    return (time.perf_counter() - started) * 1000


def importtime(environ: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Returns module -> (depth below sampler, cumulative us) for ``import sampler``."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import sampler"],
        capture_output=True,
        text=True,
        check=True,
        env=environ,
    )
    rows, found = [], {}
    for line in run.stderr.splitlines()[1:]:
        _, cumulative, name = line.split("|")
        rows.append((name.rstrip(), int(cumulative)))
        if name.strip() == "sampler":
            break
    start = max(i for i, (name, _) in enumerate(rows) if name.strip() == "site") + 1
    for name, cumulative in rows[start:]:
        found[name.strip()] = ((len(name) - len(name.lstrip()) - 1) // 2, cumulative)
    return found


def import_cost(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fleetflame-pyc-") as cache:
        environ = env(PYTHONPYCACHEPREFIX=cache)
        environ.pop("PYTHONDONTWRITEBYTECODE", None)
        timed_run("import sampler", environ)  # compiles and caches the bytecode
        base, sampled, reported = [], [], []
        for _ in range(runs):
            base.append(timed_run("pass", environ))
            sampled.append(timed_run("import sampler", environ))
            reported.append(importtime(environ))
    b, s = statistics.median(base), statistics.median(sampled)
    costs = {
        name: (depth, statistics.median(r[name][1] for r in reported if name in r) / 1000)
        for name, (depth, _) in reported[0].items()
    }
    print(f"\ncold import, bytecode cached, {runs} interleaved runs, medians:")
    print(f"  python -c pass:             {b:6.1f} ms")
    print(f"  python -c 'import sampler': {s:6.1f} ms   (+{s - b:.1f} ms, ratio {s / b:.2f})")
    print(f"  -X importtime, sampler cumulative: {costs['sampler'][1]:.1f} ms (target <= 15 ms)")
    print("  its costliest imports (cumulative ms, nested ones indented):")
    for name, (depth, ms) in reversed(costs.items()):  # importtime lists children first
        if ms >= 1.0 and 0 < depth <= 2:
            print(f"    {'  ' * (depth - 1)}{name:<{30 - 2 * depth}}{ms:6.1f}")


def stop_latency(runs: int) -> None:
    import sampler

    def hostile(url: str, port: int) -> list[socket.socket]:
        socks = [connect(port, b"GET /stacks?seconds=300 HTTP/1.1\r\n\r\n") for _ in range(8)]
        socks += [connect(port, b"GET / HT") for _ in range(50)]
        time.sleep(0.1)
        return socks

    figures = {}
    for label, clients in (("idle", None), ("8 parked reads + 50 drips", hostile)):
        durations = []
        for _ in range(runs):
            s = sampler.start(port=0)
            socks = clients(s.url, s.server.port) if clients else []
            started = time.perf_counter()
            s.server.stop()
            durations.append((time.perf_counter() - started) * 1000)
            sampler.stop()
            for sock in socks:
                sock.close()
        figures[label] = durations
    figures["stdlib server, poll 0.5 s"] = [stdlib_stop_ms() for _ in range(min(runs, 7))]
    print("\nstopping the endpoint (ms), median / max:")
    for label, durations in figures.items():
        print(f"  {label:<28}{statistics.median(durations):8.2f} / {max(durations):.2f}")
    print("  target: < 50 ms")


def stdlib_stop_ms() -> float:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5})
    thread.start()
    time.sleep(0.05)
    started = time.perf_counter()
    server.shutdown()
    server.server_close()
    took = (time.perf_counter() - started) * 1000
    thread.join()
    return took


def connect(port: int, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if first:
        sock.sendall(first)
    return sock


def latencies(url: str, requests: int, spacing: float = 0.01) -> list[float]:
    taken = []
    for _ in range(requests):
        started = time.perf_counter()
        with urllib.request.urlopen(url + "/profile.json", timeout=30) as answer:
            answer.read()
        taken.append((time.perf_counter() - started) * 1000)
        time.sleep(spacing)
    return taken


def host_status(pid: int) -> tuple[int, float]:
    """The host's thread count and resident memory (MB)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


class Drippers:
    """Clients that each send one byte a second and never finish; reconnect when cut off."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.socks = [connect(self.port, b"G") for _ in range(count)]
        self.cut_off = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip)
        self._thread.start()

    def _drip(self) -> None:
        while not self._stop.wait(1.0):
            # The server sends a dripping client nothing until it cuts it off (a 408, or
            # closing the oldest past its connection cap): anything readable means cut off.
            readable, _, _ = select.select(self.socks, [], [], 0)
            for i, sock in enumerate(self.socks):
                try:
                    if sock in readable:
                        raise ConnectionResetError
                    sock.send(b"E")
                except OSError:
                    self.cut_off += 1
                    sock.close()
                    try:
                        self.socks[i] = connect(self.port, b"G")
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.socks:
            sock.close()


def under_attack(requests: int) -> None:
    host = subprocess.Popen(
        [sys.executable, "-c", HOST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert host.stdout is not None and host.stdin is not None
    try:
        url = host.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1])
        time.sleep(3)  # the profile fills up
        rows: list[tuple[str, list[float], tuple[int, float]]] = []

        def measure(label: str, during: Callable[[], Callable[[], None]] | None) -> None:
            close = during() if during else None
            try:
                time.sleep(0.5)
                # Every row spread over 12 s, past the drippers' 10 s head deadline, so the
                # rows differ only by what the other clients do.
                taken = latencies(url, requests, spacing=12.0 / requests)
                rows.append((label, taken, host_status(host.pid)))
            finally:
                if close:
                    close()

        def parked() -> Callable[[], None]:
            socks = [connect(port, b"GET /stacks?seconds=300 HTTP/1.1\r\n\r\n") for _ in range(8)]
            return lambda: [sock.close() for sock in socks] and None

        drippers: list[Drippers] = []

        def drips() -> Callable[[], None]:
            drippers.append(Drippers(port, 300))
            return drippers[0].close

        measure("idle", None)
        measure("8 long reads parked", parked)
        measure("300 dripping clients", drips)
        measure("idle again", None)
    finally:
        host.stdin.write("\n")
        host.stdin.flush()
        host.wait(timeout=30)
    base = statistics.median(rows[0][1])
    _, base_rss = rows[0][2]
    print(f"\n/profile.json seen by a collector, {requests} requests over 12 s each (ms):")
    print(
        f"  {'while':<24}{'median':>8}{'p90':>8}{'max':>8}{'ratio':>8}{'threads':>9}{'RSS MB':>9}"
    )
    for label, taken, (threads, rss) in rows:
        p90 = statistics.quantiles(taken, n=10)[-1]
        median = statistics.median(taken)
        print(
            f"  {label:<24}{median:8.2f}{p90:8.2f}{max(taken):8.2f}{median / base:8.2f}"
            f"{threads:9d}{rss:9.1f}"
        )
    print(f"  RSS with 300 dripping clients: {rows[2][2][1] - base_rss:+.1f} MB over idle")
    print(
        f"  dripping clients cut off and reconnected over 12 s: {drippers[0].cut_off} "
        "(256 connections at most, a request head due within 10 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs per import/stop figure")
    parser.add_argument("--requests", type=int, default=50, help="requests per latency row")
    options = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    import_cost(options.runs)
    stop_latency(options.runs)
    under_attack(options.requests)


if __name__ == "__main__":
    main()
