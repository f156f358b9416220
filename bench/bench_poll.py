"""Benchmark of the collector's poll rounds over a simulated fleet, at 1x and 10x its size.

A fleet process listens on one port of 127.0.0.1 per target (asyncio, kept-alive HTTP/1.1) and
answers /profile.json like a sampler: `--stacks` distinct stacks 20-50 frames deep, cumulative
counts growing on `--changed` of them between two requests, only those for a read
`?since=` (the collector's incremental read), gzipped when asked. A collector process (the real
`collector.service.Collector` on a SQLite file) polls them: a first round that stores every
count, then `--cycles` steady rounds. Each run is a fresh pair of processes, so the memory it
reports is its own; every figure is the median of `--runs` runs, printed as a ratio to its
target (issue 13): a steady round of 500 targets in <= 3 s, <= 1 CPU-second, <= 0.3 MB of
collector memory per target.

    python bench/bench_poll.py                     # 50 and 500 targets x 2,000 stacks, 3 runs
    python bench/bench_poll.py --targets 100 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET_ROUND_S = 3.0  # a steady round of 500 targets
TARGET_CPU_S = 1.0
TARGET_MB_PER_TARGET = 0.3


# -- the simulated fleet (a process of its own) ------------------------------------------------


def stack_lists(stacks: int, changed: int, rounds: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Per round, the JSON of every stack entry and of the entries that grew since the round
    before (what `?since=` asks for); all targets share them (they run the same code)."""
    from bench_store import make_stacks

    rng = random.Random(seed)
    names = [json.dumps(name) for name in make_stacks(rng, stacks)]
    counts = [rng.randint(1, 5000) for _ in names]
    out = []
    for r in range(rounds):
        grew = sorted(rng.sample(range(stacks), changed)) if r else range(stacks)
        for i in grew if r else ():
            counts[i] += rng.randint(1, 60)

        def entries(indexes) -> bytes:
            return ",".join(f"[0,{names[i]},{counts[i]}]" for i in indexes).encode()

        out.append((entries(range(stacks)), entries(grew)))
    return out


class Answers:
    """Gzipped answers made from a compressed shared prefix (the stacks) and a per-target end:
    the sampler compresses in each worker, so the fleet process must not do it all here."""

    def __init__(self, rounds: list[tuple[bytes, bytes]]) -> None:
        self.rounds = []
        for r, (full, grew) in enumerate(rounds):
            self.rounds.append((self._prefix(full, 0, r + 1), self._prefix(grew, r, r + 1)))

    @staticmethod
    def _prefix(entries: bytes, since: int, generation: int):
        head = b'{"generation":%d,"since":%d,"stacks":[%s],' % (generation, since, entries)
        packer = zlib.compressobj(1, zlib.DEFLATED, 31)
        return head, packer, packer.compress(head)

    def body(self, r: int, incremental: bool, end: bytes, gzip: bool) -> bytes:
        head, packer, packed = self.rounds[r][1 if incremental else 0]
        if not gzip:
            return head + end
        finish = packer.copy()
        return packed + finish.compress(end) + finish.flush()


def target_end(index: int) -> bytes:
    """The per-target part of a document: its identity and labels (the last fields)."""
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
    return json.dumps(doc).encode()[1:]


async def serve_fleet(
    size: int, answer: Callable[[int, bytes], tuple[bytes, bool]]
) -> list[asyncio.Server]:
    """Listens on ``size`` ports of 127.0.0.1 (kept-alive HTTP/1.1); a request head to the
    i-th is answered with ``answer(i, head)``: a body, and whether it is gzipped. The tests'
    fleet of real targets (tests/collector/pollhelpers.py) is served by it too."""

    def handler(index: int):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while request := await reader.readuntil(b"\r\n\r\n"):
                    body, gzip = answer(index, request)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s"
                        b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n%s"
                        % (b"Content-Encoding: gzip\r\n" if gzip else b"", len(body), body)
                    )
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        return handle

    return [
        await asyncio.start_server(handler(i), "127.0.0.1", 0, backlog=128) for i in range(size)
    ]


async def serve(args: argparse.Namespace) -> None:
    answers = Answers(stack_lists(args.stacks, args.changed, args.cycles + 1, seed=1))
    last = len(answers.rounds) - 1
    served = [0] * args.fleet_size
    ends = [target_end(i) for i in range(args.fleet_size)]

    def answer(index: int, request: bytes) -> tuple[bytes, bool]:
        r = min(served[index], last)
        served[index] += 1
        # A reader holding round r (generation r) gets what grew since.
        incremental = r > 0 and b"?since=%d&" % r in request
        gzip = b"gzip" in request.lower()
        return answers.body(r, incremental, ends[index], gzip), gzip

    servers = await serve_fleet(args.fleet_size, answer)
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF


# -- one run: a collector process polling the fleet ---------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def collect(args: argparse.Namespace) -> None:
    """Polls the fleet on the ports given on stdin; prints one JSON line of figures."""
    from collector.service import Collector
    from collector.settings import load_settings

    ports = json.loads(sys.stdin.readline())
    with tempfile.TemporaryDirectory() as tmp:
        now = [1_795_000_000.0]
        settings = load_settings(environ={}).replace(
            database_url=f"sqlite:///{tmp}/bench.db",
            targets=[f"127.0.0.1:{port}" for port in ports],
            health_listen="",
            read_timeout=30.0,
            fetch_deadline=60.0,
        )
        collector = Collector(settings, clock=lambda: now[0])
        collector.migrate()
        base = rss_mb()
        try:
            cpu = time.process_time()
            first = collector.poll_cycle()
            first_cpu = time.process_time() - cpu
            after_first = rss_mb()
            steady = []
            for _ in range(args.cycles):
                now[0] += 10
                cpu = time.process_time()
                report = collector.poll_cycle()
                steady.append((report, time.process_time() - cpu))
            held = rss_mb()
            kept = collector.poller.kept_connections
        finally:
            collector.stop()
    failed = first.ok != len(ports) or any(r.ok != len(ports) for r, _ in steady)
    median = statistics.median
    print(
        json.dumps(
            {
                "targets": len(ports),
                "failed": failed,
                "kept_connections": kept,
                "first_rows": first.rows,
                "first_round_s": first.fetch_seconds,
                "first_write_s": first.write_seconds,
                "first_cpu_s": first_cpu,
                "round_s": median(r.fetch_seconds for r, _ in steady),
                "poll_cpu_s": median(r.cpu_seconds for r, _ in steady),
                "process_cpu_s": median(c for _, c in steady),
                "write_s": median(r.write_seconds for r, _ in steady),
                "rows": median(r.rows for r, _ in steady),
                "received_mb": median(r.received_bytes for r, _ in steady) / 1e6,
                "mb_per_target": (held - base) / len(ports),
                "first_mb_per_target": (after_first - base) / len(ports),
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
            }
        )
    )


def run_once(targets: int, args: argparse.Namespace) -> dict:
    common = ["--stacks", str(args.stacks), "--changed", str(args.changed)]
    common += ["--cycles", str(args.cycles), "--fleet-size", str(targets)]
    fleet = subprocess.Popen(
        [sys.executable, __file__, "--serve", *common],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fleet.stdout is not None and fleet.stdin is not None
    try:
        ports = fleet.stdout.readline()
        done = subprocess.run(
            [sys.executable, __file__, "--collect", *common],
            input=ports,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"collector run failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        fleet.stdin.close()
        fleet.wait(timeout=60)
    assert not result["failed"], "targets failed"
    return result


def ratio(value: float, target: float) -> str:
    verdict = "met" if value <= target else "MISSED"
    return f"{value / target:.2f}x ({verdict})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--targets", default="50,500", help="fleet sizes: 1x and 10x")
    parser.add_argument("--stacks", type=int, default=2000, help="distinct stacks per target")
    parser.add_argument("--changed", type=int, default=200, help="stacks that grow per round")
    parser.add_argument("--cycles", type=int, default=3, help="steady rounds per run (median)")
    parser.add_argument("--runs", type=int, default=3, help="runs per size (median)")
    parser.add_argument("--fleet-size", type=int, default=500, help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--collect", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args))
        return
    if args.collect:
        collect(args)
        return
    sizes = [int(size) for size in args.targets.split(",")]
    print(
        f"{args.stacks} stacks a target, {args.changed} growing a round; "
        f"medians of {args.runs} runs x {args.cycles} steady rounds"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[int, list[dict]] = {size: [] for size in sizes}
    for _ in range(args.runs):  # sizes interleaved, so a busy spell hits both
        for size in sizes:
            results[size].append(run_once(size, args))
    median = statistics.median
    for size in sizes:
        runs = results[size]

        def m(key: str, runs: list[dict] = runs) -> float:
            return median(run[key] for run in runs)

        scale = size / 500  # the targets are for 500 targets; smaller fleets get their share
        print(f"\n{size} targets ({m('kept_connections'):.0f} connections kept alive):")
        print(
            f"  steady round  {m('round_s'):6.2f} s   {ratio(m('round_s'), TARGET_ROUND_S * scale)}"
            f"  [{m('received_mb'):.1f} MB received, {m('rows'):.0f} rows]"
        )
        print(
            f"  poll CPU      {m('poll_cpu_s'):6.2f} s   {ratio(m('poll_cpu_s'), TARGET_CPU_S * scale)}"
            f"  [whole process with the write: {m('process_cpu_s'):.2f} s,"
            f" write {m('write_s'):.2f} s]"
        )
        print(
            f"  memory        {m('mb_per_target'):6.3f} MB a target"
            f"   {ratio(m('mb_per_target'), TARGET_MB_PER_TARGET)}"
            f"  [RSS growth {m('mb_per_target') * size:.0f} MB / {size}; after the first round"
            f" {m('first_mb_per_target'):.3f} a target; peak RSS {m('peak_mb'):.0f} MB]"
        )
        print(
            f"  first round   {m('first_round_s'):6.2f} s, {m('first_rows'):.0f} rows written in"
            f" {m('first_write_s'):.2f} s, {m('first_cpu_s'):.2f} CPU-s"
        )
    if len(sizes) == 2:
        small, large = sizes
        grow = {
            key: median(r[key] for r in results[large]) / median(r[key] for r in results[small])
            for key in ("round_s", "poll_cpu_s")
        }
        held = {size: median(r["mb_per_target"] for r in results[size]) * size for size in sizes}
        marginal = (held[large] - held[small]) / (large - small)
        print(
            f"\n{large / small:.0f}x the targets: round {grow['round_s']:.1f}x, poll CPU "
            f"{grow['poll_cpu_s']:.1f}x, memory {held[large] / held[small]:.1f}x;"
            f" each target past the first {small}: {marginal:.3f} MB"
            f" {ratio(marginal, TARGET_MB_PER_TARGET)}"
        )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    main()
