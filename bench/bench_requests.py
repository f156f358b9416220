"""Benchmark of /api/requests over windows of 1 hour to 30 days (issue 16), through a real
``fleetflame web``, each window never asked before.

The store holds the request_fleet rows the worst-cases job leaves (collector/worst.py: every
instance merged per service and route, by the day, hour, ten minutes and minute) for
--services services x --routes routes a service, those the windows read: each window is
read in as few rows as fit it, so what it costs grows with the service-routes and the window's
shape, not with the instances. Each route's latency sketch spans 1 ms to 2 s (~300 bins,
packed as the job stores them: ~1.7 KB for its three sketches), its slow requests carry 20 stacks. Windows end
inside the last hour and start a span earlier, a minute later run after run, so no answer is
cached; the server's CPU and memory are read beside the wall time. At 1x and 10x the routes.
Medians of --runs.

    python bench/bench_requests.py                  # SQLite, 4 and 40 routes a service, 3 runs
    python bench/bench_requests.py --engines sqlite,postgresql
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from benchfleet import WebServer, database, load_average, median, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.request_rows import SKETCHES, pack_sketch  # noqa: E402
from collector.store import Store, schema  # noqa: E402
from collector.worst_rows import FLEET_WIDTHS  # noqa: E402
from sampler._sketch import Sketch  # noqa: E402
from sampler.profile import align_up  # noqa: E402
from webui.worst import _cover  # noqa: E402

HOUR, DAY = 3600, 86400
SPANS = {"1 h": HOUR, "24 h": DAY, "7 d": 7 * DAY, "30 d": 30 * DAY}
TARGET_MS = {"1 h": 100, "24 h": 150, "7 d": 300, "30 d": 500}  # issue 13's, for profiles


def figures(rng: random.Random, route: str) -> dict[str, str]:
    """One row's sketches and slow requests, as the job stores them."""
    latency = Sketch()
    for _ in range(2000):
        latency.add(min(2.0, 0.001 * rng.lognormvariate(2, 1.2)))
    sketches = {name: pack_sketch(latency) for name in SKETCHES}
    stacks = {f"main;app:{route};lib:step{i};db:query": rng.random() for i in range(20)}
    slowest = [{"id": i, "duration": 1.0 + i, "path": route} for i in range(5)]
    return {
        "sketches": json.dumps(sketches),
        "slow": json.dumps({"count": 20, "stacks": stacks, "slowest": slowest}),
    }


def windows(now: int, runs: int) -> list[tuple[str, int, int]]:
    """(span name, from, to) of every request the bench makes."""
    return [
        (name, end - span, end)
        for run in range(runs)
        for name, span in SPANS.items()
        for end in [now - 50 * 60 + 60 * run + 17]  # inside the last hour, new each run
    ]


def fill(url: str, now: int, services: int, routes: int, runs: int) -> int:
    """Writes the request_fleet rows the windows read; returns how many."""
    store = Store(url)
    store.migrate()
    rng = random.Random(1)
    names = [(f"svc-{s}", f"/route/{r}/<id>") for s in range(services) for r in range(routes)]
    docs = {name: figures(rng, name[1]) for name in names}
    buckets = {
        (width, bucket)
        for _, start, end in windows(now, runs)
        for width, first, last in _cover(align_up(start, 60), align_up(end, 60), FLEET_WIDTHS)
        for bucket in range(first, last, width)
    }
    rows = [
        {"width": width, "bucket": bucket, "service": service, "route": route}
        | {"count": 1000 * width // 60, "errors": 3}
        | docs[(service, route)]
        for width, bucket in sorted(buckets)
        for service, route in names
    ]
    with store.engine.write_transaction() as conn:
        for start in range(0, len(rows), 2000):
            conn.execute(schema.request_fleet.insert(), rows[start : start + 2000])
    store.close()
    return len(rows)


def bench(url: str, now: int, runs: int) -> dict[str, list[tuple[float, float, int]]]:
    results: dict[str, list[tuple[float, float, int]]] = {}
    with WebServer(url) as server:
        server.wait()
        for name, start, end in windows(now, runs):
            elapsed, cpu, answer = server.get(f"/api/requests?from={start}&to={end}")
            assert answer["routes"], answer
            read = sum(route["count"] for route in answer["routes"])
            results.setdefault(name, []).append((elapsed, cpu, read))
        rss, peak = server.memory_mb()
    results["memory"] = [(rss, peak, 0)]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite", help="sqlite,postgresql")
    parser.add_argument("--services", type=int, default=5)
    parser.add_argument("--routes", default="4,40", help="routes a service: 1x and 10x")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    now = int(time.time()) // HOUR * HOUR
    for engine in args.engines.split(","):
        for routes in map(int, args.routes.split(",")):
            with database(engine) as url:
                began = time.perf_counter()
                rows = fill(url, now, args.services, routes, args.runs)
                filled = time.perf_counter() - began
                results = bench(url, now, args.runs)
            print(
                f"== {engine}, {args.services} services x {routes} routes: {rows:,} fleet rows "
                f"for the windows (written in {filled:.0f} s); load {load_average()}"
            )
            for name, target in TARGET_MS.items():
                wall = median([w for w, _, _ in results[name]])
                cpu = median([c for _, c, _ in results[name]])
                runs = ", ".join(f"{w:.0f}" for w, _, _ in results[name])
                print(
                    f"  {name:>5}: {wall:7.0f} ms, server CPU {cpu:6.0f} ms  (runs: {runs})  "
                    f"{verdict(wall, target)}"
                )
            rss, peak, _ = results["memory"][0]
            print(f"  server memory {rss:.0f} MB, peak {peak:.0f} MB")


if __name__ == "__main__":
    main()
