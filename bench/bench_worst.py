"""Benchmark of the collector's worst-cases job (issue 16): what polling every target's
``/stalls.json`` and ``/requests.json`` and storing what is new costs per target, at 1x and 10x
the targets.

The documents are real: a sampler process (the native engine where it loads) runs an asyncio
loop with planted stalls and ``--routes`` routes of requests through ``sampler.middleware``, and
its two documents are read once. A fleet process then serves them on one port of 127.0.0.1 per
target (asyncio, kept-alive HTTP/1.1), each target with its own instance and series, so every
target's stalls and routes are its own. The real ``collector.worst.WorstCases`` on a SQLite
file polls them: a first round that stores every stall and route, then ``--cycles`` steady
rounds (nothing new: what the job costs when it runs every 30 s on a quiet fleet). Per round:
wall time, the collector's CPU time (its threads included), rows stored, and the collector's
resident memory after the rounds over its memory before them, per target.

    python bench/bench_worst.py                   # 50 and 500 targets, 3 steady rounds
    python bench/bench_worst.py --targets 20 --cycles 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKER = r"""
import asyncio, sys, time, wsgiref.util
import sampler, sampler.middleware

sampler.start(port=int(sys.argv[1]), service="shop", labels={"version": "1.0"})
routes = int(sys.argv[2])


def planted_blocking_call():
    time.sleep(0.08)


async def main():
    for _ in range(5):
        await asyncio.sleep(0.01)
        planted_blocking_call()

asyncio.run(main())


def app(environ, start_response):
    end = time.thread_time() + (0.004 if environ["PATH_INFO"] == "/r0" else 0.0002)
    while time.thread_time() < end:
        pass
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


wrapped = sampler.middleware.WSGIMiddleware(app)
for i in range(routes * 50):
    environ = {"PATH_INFO": f"/r{i % routes}", "REQUEST_METHOD": "GET"}
    wsgiref.util.setup_testing_defaults(environ)
    body = wrapped(environ, lambda *a: None)
    list(body)
    body.close()
time.sleep(1.0)  # the recorder's batch
print("ready", flush=True)
time.sleep(300)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_documents(routes: int) -> tuple[bytes, bytes]:
    """Runs a real sampler with stalls and requests; returns its two documents."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(port), str(routes)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        read = [
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read()
            for path in ("/stalls.json?since=0", "/requests.json")
        ]
    finally:
        process.kill()
        process.wait()
    return read[0], read[1]


def serve(stalls: bytes, requests: bytes, targets: int) -> None:
    """Serves the documents on a port of its own for each target (printed as a JSON list),
    each target with its own instance and series."""
    instance = json.loads(stalls)["instance"]
    series = json.loads(requests)["series"]

    def own(body: bytes, index: int) -> bytes:
        text = body.decode()
        for old in (instance, series):
            text = text.replace(old, f"{index:0{len(old)}x}"[-len(old) :])
        return text.encode()

    async def main() -> None:
        async def handler(index: int, reader, writer) -> None:  # type: ignore[no-untyped-def]
            bodies = {b"/stalls.json": own(stalls, index), b"/requests.json": own(requests, index)}
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    path = head.split(b" ", 2)[1].split(b"?")[0]
                    body = bodies.get(path)
                    status = b"200 OK" if body is not None else b"404 Not Found"
                    body = body or b"{}"
                    writer.write(
                        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                    )
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        ports = []
        for index in range(targets):
            server = await asyncio.start_server(
                lambda r, w, i=index: handler(i, r, w), "127.0.0.1", 0, backlog=64
            )
            ports.append(server.sockets[0].getsockname()[1])
        print(json.dumps(ports), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def run(targets: int, documents: tuple[bytes, bytes], cycles: int) -> dict[str, float]:
    from collector.store import Store
    from collector.targets import Target
    from collector.worst import WorstCases

    fleet = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(targets)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=False,
    )
    assert fleet.stdin is not None and fleet.stdout is not None
    fleet.stdin.write(json.dumps([documents[0].decode(), documents[1].decode()]).encode())
    fleet.stdin.close()
    ports = json.loads(fleet.stdout.readline())
    try:
        with tempfile.TemporaryDirectory() as folder:
            store = Store(f"sqlite:///{folder}/worst.db")
            store.migrate()
            job = WorstCases(store)
            fleet_targets = [Target("127.0.0.1", port) for port in ports]
            before = rss_mb()
            rounds = []
            for cycle in range(cycles + 1):
                cpu, began = cpu_seconds(), time.perf_counter()
                stored = job.poll(fleet_targets, time.time() + 60 * cycle)
                rounds.append(
                    (time.perf_counter() - began, cpu_seconds() - cpu, sum(stored.values()))
                )
            after = rss_mb()
            job.close()
            store.close()
    finally:
        fleet.kill()
        fleet.wait()
    steady = rounds[1:]
    return {
        "first_s": rounds[0][0],
        "first_cpu": rounds[0][1],
        "first_rows": rounds[0][2],
        "steady_s": statistics.median(r[0] for r in steady),
        "steady_cpu": statistics.median(r[1] for r in steady),
        "steady_rows": statistics.median(r[2] for r in steady),
        "mb_per_target": (after - before) / targets,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=50, help="the 1x fleet")
    parser.add_argument("--routes", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        stalls, requests = json.loads(sys.stdin.buffer.read())
        serve(stalls.encode(), requests.encode(), args.serve)
        return
    documents = real_documents(args.routes)
    stalls, requests = (json.loads(d) for d in documents)
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"documents of a real sampler: /stalls.json {len(documents[0]):,} bytes "
          f"({len(stalls['stalls'])} stalls), /requests.json {len(documents[1]):,} bytes "
          f"({len(requests['routes'])} routes)")  # fmt: skip
    rows = []
    for scale in (1, 10):
        targets = args.targets * scale
        print(f"{scale}x: {targets} targets", flush=True)
        rows.append((scale, targets, run(targets, documents, args.cycles)))
    print(f"\nworst-cases job, SQLite; steady: median of {args.cycles} rounds with nothing new")
    print(f"{'scale':>5} {'targets':>7} {'first s':>8} {'first cpu':>9} {'rows':>6} "
          f"{'steady s':>8} {'steady cpu':>10} {'ms cpu/target':>13} {'MB/target':>9}")  # fmt: skip
    for scale, targets, f in rows:
        print(f"{scale:>4}x {targets:>7} {f['first_s']:>8.2f} {f['first_cpu']:>9.2f} "
              f"{f['first_rows']:>6.0f} {f['steady_s']:>8.2f} {f['steady_cpu']:>10.2f} "
              f"{1000 * f['steady_cpu'] / targets:>13.2f} {f['mb_per_target']:>9.3f}")  # fmt: skip
    (_, _, one), (_, _, ten) = rows
    print(f"10x / 1x: steady round {ten['steady_s'] / one['steady_s']:.1f}x wall, "
          f"{ten['steady_cpu'] / one['steady_cpu']:.1f}x CPU")  # fmt: skip


if __name__ == "__main__":
    main()
