"""A bounded load generator for the demo shop; it only ever talks to 127.0.0.1.

Run as ``python -m demoshop.loadgen --url http://127.0.0.1:8001 --rate 12``. The request rate
and concurrency are capped, and any host other than the loopback is refused, so pointing it
at something else by mistake cannot turn it into a load test of someone's server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_RATE = 100.0
MAX_CONCURRENCY = 16
WORDS = ("oak", "steel", "lamp", "chair", "wool", "kettle", "rustic", "compact", "travel", "mug")
# Share of requests per route: browsing dominates, checkouts are rarer but heavier.
ROUTE_MIX = (("products", 0.3), ("search", 0.25), ("checkout", 0.3), ("report", 0.15))


def parse_target(url: str) -> tuple[str, int]:
    """Returns (host, port) of an http URL on the loopback; raises ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"expected a URL like http://127.0.0.1:8001, not {url!r}")
    if parts.hostname not in LOOPBACK:
        raise ValueError(
            f"the demo load generator only sends requests to 127.0.0.1, not {parts.hostname!r}"
        )
    return parts.hostname, parts.port


def make_request(rng: random.Random, products: int) -> tuple[str, str, str, bytes | None]:
    """Picks the next request of the route mix: (route, method, path, body)."""
    route = rng.choices([r for r, _ in ROUTE_MIX], weights=[w for _, w in ROUTE_MIX])[0]
    if route == "products":
        return route, "GET", f"/api/products?page={rng.randint(1, 50)}", None
    if route == "search":
        terms = "+".join(rng.sample(WORDS, 2))
        return route, "GET", f"/api/search?q={terms}", None
    if route == "checkout":
        # Bulk orders with repeated SKUs: merging duplicate lines is real work.
        lines = [
            {"sku": f"SKU-{rng.randint(1, products):06d}", "qty": rng.randint(1, 5)}
            for _ in range(800)
        ]
        body = json.dumps({"lines": lines, "discount": rng.choice((0, 5, 10))}).encode()
        return route, "POST", "/api/checkout", body
    return route, "GET", "/api/report", None


@dataclass
class Stats:
    """Requests sent per route and outcome, shared by the load threads."""

    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def summary(self) -> str:
        with self.lock:
            return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))


class _Pacer:
    """Hands out send times so all threads together never exceed ``rate`` requests/s."""

    def __init__(self, rate: float) -> None:
        self._period = 1.0 / rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, stop: threading.Event) -> bool:
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next + self._period, now)
            due = self._next
        return not stop.wait(max(0.0, due - now))


def _worker(
    targets: list[tuple[str, int]],
    pacer: _Pacer,
    stop: threading.Event,
    stats: Stats,
    seed: int,
    products: int,
) -> None:
    rng = random.Random(seed)
    conns: dict[tuple[str, int], http.client.HTTPConnection] = {}
    while pacer.wait(stop):
        target = rng.choice(targets)
        route, method, path, body = make_request(rng, products)
        headers = {"Content-Type": "application/json"} if body else {}
        # A kept-alive connection may have been closed by a worker that exited (the demo's
        # rolling deploy): retry once on a fresh connection before counting an error.
        for attempt in (1, 2):
            reused = target in conns
            conn = conns.get(target) or http.client.HTTPConnection(*target, timeout=30)
            conns[target] = conn
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conns.pop(target, None)
                if attempt == 1 and reused:
                    continue
                stats.add(f"{route}:error")
            else:
                stats.add(f"{route}:{response.status}")
            break
    for conn in conns.values():
        conn.close()


def run(
    urls: list[str],
    rate: float,
    concurrency: int,
    stop: threading.Event,
    products: int = 300,
    seed: int = 1,
) -> Stats:
    """Sends the route mix to ``urls`` until ``stop`` is set and returns what was sent."""
    targets = [parse_target(u) for u in urls]
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate must be above 0 and at most {MAX_RATE:g} requests/s")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY}")
    stats, pacer = Stats(), _Pacer(rate)
    threads = [
        threading.Thread(
            target=_worker,
            args=(targets, pacer, stop, stats, seed + i, products),
            name=f"load-{i}",
            daemon=True,
        )
        for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


def main(argv: list[str] | None = None) -> int:
    """Runs the load generator until SIGTERM, SIGINT or ``--duration`` seconds."""
    parser = argparse.ArgumentParser(prog="python -m demoshop.loadgen", description=__doc__)
    parser.add_argument("--url", action="append", required=True, help="shop URL (repeatable)")
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second in all")
    parser.add_argument("--concurrency", type=int, default=6, help="requests in flight at most")
    parser.add_argument("--duration", type=float, default=0, help="stop after S seconds (0: never)")
    args = parser.parse_args(argv)
    try:
        for url in args.url:
            parse_target(url)
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.duration:
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    try:
        stats = run(args.url, args.rate, args.concurrency, stop)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"loadgen stopped: {stats.summary()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
