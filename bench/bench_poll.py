"""Benchmark of one collector poll cycle over a simulated fleet of `--targets` workers.

A server process listens on `--targets` ports of 127.0.0.1 (asyncio, keep-alive HTTP/1.1)
and answers each /profile.json like a sampler would: `--stacks` distinct stacks 20-50 frames
deep, cumulative counts that grow on `--changed` stacks between two requests to a target, and
like a sampler it answers `?since=` (the collector's incremental read) with only those. The
collector (the real `collector.service.Collector`, on a SQLite file) polls them all, computes
deltas and writes them. The first cycle sees every target for the first time and stores all
its counts; the steady-state cycles after it are what the 5 s target is about.

Baseline measured in the same run: the same thread pool and HTTP session fetching every whole
document (no `since`) without parsing it, the transfer alone of a collector that did not read
incrementally.

    python bench/bench_poll.py                       # 500 targets x 2,000 stacks
    python bench/bench_poll.py --targets 100 --cycles 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

TARGET_CYCLE_S = 5.0


# -- the simulated fleet (runs in its own process) ---------------------------------------------


def fragments(stacks: int, changed: int, rounds: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Returns, per round, the end of every target's document listing all stacks, and the end
    of one listing only those that grew since the round before (what `?since=` asks for)."""
    from bench_store import make_stacks

    rng = random.Random(seed)
    names = make_stacks(rng, stacks)
    counts = [rng.randint(1, 5000) for _ in names]
    out = []
    for r in range(rounds):
        grew = set(rng.sample(range(stacks), changed)) if r else set(range(stacks))
        for i in grew:
            counts[i] += rng.randint(1, 60) if r else 0
        generation = r + 1

        def tail(indexes, since: int, generation: int = generation) -> bytes:
            entries = ",".join(f"[0,{json.dumps(names[i])},{counts[i]}]" for i in sorted(indexes))
            return f'"generation":{generation},"since":{since},"stacks":[{entries}]}}'.encode()

        out.append((tail(range(stacks), 0), tail(grew, generation - 1 if r else 0)))
    return out


def header(index: int) -> bytes:
    """The per-target part of a document: its identity and labels."""
    doc = {
        "format": "fleetflame.profile/1",
        "instance": {"id": f"sim{index:06d}", "pid": 1000 + index, "start_time": 1.0, "host": "h"},
        "labels": {"service": f"svc{index % 5}", "host": f"host-{index // 4}"},
        "mode": "cpu",
        "interval": 0.01,
        "effective_interval": 0.01,
        "time": time.time(),
        "total_samples": 0,
        "dropped_samples": 0,
        "label_sets": [{}],
    }
    return json.dumps(doc).encode()[:-1] + b","


async def serve(args: argparse.Namespace) -> None:
    rounds = fragments(args.stacks, args.changed, args.cycles + 1, seed=1)

    def handler(index: int):
        served = 0
        head = header(index)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal served
            try:
                while request := await reader.readuntil(b"\r\n\r\n"):
                    r = min(served, len(rounds) - 1)
                    full, grew = rounds[r]
                    # A reader holding the round before (generation r) gets what grew since.
                    body = head + (grew if b"?since=%d&" % r in request and r else full)
                    served += 1
                    # Like the sampler's endpoint: one request per connection.
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
                    )
                    writer.write(body)
                    await writer.drain()
                    break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        return handle

    servers = [
        await asyncio.start_server(handler(i), "127.0.0.1", 0, backlog=64)
        for i in range(args.targets)
    ]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF


# -- the measurement -------------------------------------------------------------------------


def raw_fetch_seconds(poller, urls: list[str]) -> float:
    """The baseline: every body fetched through the poller's pool and session, not parsed."""
    started = time.perf_counter()
    list(poller._pool.map(lambda url: len(poller.session.get(url, timeout=30).content), urls))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--stacks", type=int, default=2000, help="distinct stacks per target")
    parser.add_argument("--changed", type=int, default=200, help="stacks that grow per cycle")
    parser.add_argument("--cycles", type=int, default=5, help="steady-state cycles (median)")
    parser.add_argument("--concurrency", type=int, default=None, help="poll_concurrency")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args))
        return

    from collector.service import Collector
    from collector.settings import load_settings

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", *sys.argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    ports = json.loads(server.stdout.readline())
    print(f"{len(ports)} targets x {args.stacks} stacks, {args.changed} growing per cycle")
    with tempfile.TemporaryDirectory() as tmp:
        now = [1_795_000_000.0]
        settings = load_settings(environ={})
        settings = settings.replace(
            poll_concurrency=args.concurrency or settings.poll_concurrency,
            database_url=f"sqlite:///{tmp}/bench.db",
            targets=[f"127.0.0.1:{port}" for port in ports],
            health_listen="",
            read_timeout=30.0,
            fetch_deadline=60.0,
        )
        collector = Collector(settings, clock=lambda: now[0])
        collector.store.migrate()
        try:
            first = collector.poll_cycle()
            steady = []
            for _ in range(args.cycles):
                now[0] += 10
                steady.append(collector.poll_cycle())
            # The baseline gets the last round's bodies again (the server repeats it).
            urls = [f"http://127.0.0.1:{port}/profile.json" for port in ports]
            baseline = statistics.median(
                raw_fetch_seconds(collector.poller, urls) for _ in range(3)
            )
        finally:
            collector.stop()
            server.stdin.close()
            server.wait(timeout=30)
    assert first.ok == len(ports) and all(r.ok == len(ports) for r in steady), "targets failed"

    def total(r) -> float:
        return r.fetch_seconds + r.write_seconds

    cycle = statistics.median(total(r) for r in steady)
    fetch = statistics.median(r.fetch_seconds for r in steady)
    write = statistics.median(r.write_seconds for r in steady)
    rows = statistics.median(r.rows for r in steady)
    verdict = "met" if cycle <= TARGET_CYCLE_S else "MISSED"
    print(
        f"first cycle (all counts new): {total(first):.2f} s, {first.rows} rows "
        f"(fetch+delta {first.fetch_seconds:.2f} s, write {first.write_seconds:.2f} s)"
    )
    print(
        f"steady cycle, median of {args.cycles}: {cycle:.2f} s (target <= {TARGET_CYCLE_S:.0f} s:"
        f" {verdict}); fetch+parse+delta {fetch:.2f} s, write {write:.2f} s of {rows:.0f} rows"
    )
    print(
        f"baseline, whole documents fetched unparsed: {baseline:.2f} s; "
        f"cycle / baseline = {cycle / baseline:.2f}"
    )


if __name__ == "__main__":
    main()
