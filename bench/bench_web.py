"""Benchmark of the web UI: server time of /api/flamegraph, and time to a drawn flamegraph.

1. A fleet like the collector benchmark's (50 instances x 2,000 distinct stacks, 200 with
   samples per minute, 24 h written through the store with its rollups): the server time of
   /api/flamegraph for the last hour and the last 24 hours (in-process WSGI call, JSON
   included, profile cache off), split into the store query and the tree pruning.
2. One window holding 200,000 distinct stacks, in-process: /api/flamegraph and /api/top on a
   fresh app (cold: asked the moment it starts; and once it has warmed its stack index), and
   for a window not seen yet (no browser competing for the cores).
3. The same window: time from navigation to a drawn flamegraph in
   headless Chromium (performance mark after the first frame with the graph) on a fresh
   server (cold, and once warmed), on a running server for a window not seen yet (from a
   browser's first visit, and from a browser that has the page's static files), and for the
   same view again; target <= 1 s.

Prints medians of --runs runs and their ratio to the targets.

    python bench/bench_web.py                 # SQLite, the full fleet (several minutes)
    python bench/bench_web.py --quick         # 10 instances, 3 hours, 50,000 stacks
    python bench/bench_web.py --engines sqlite,postgresql
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa  # noqa: E402
from flask import Flask  # noqa: E402
from flask.testing import FlaskClient  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402

from collector.store import SampleRow, Store  # noqa: E402
from webui import create_app  # noqa: E402
from webui.model import flame_tree  # noqa: E402

PG_ADMIN_URL = os.environ.get(
    "FLEETFLAME_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DAY = 86400
TARGET_DRAW_MS = 1000
# The collector benchmark's query targets, for comparison with the whole request.
TARGET_1H_MS = 200
TARGET_24H_MS = 500
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def make_stacks(rng: random.Random, count: int) -> list[str]:
    """Returns ``count`` distinct stacks 20-50 frames deep grown from a shared call tree."""
    modules = [f"app.mod{i}" for i in range(40)] + ["json", "re", "socket", "ssl", "sqlalchemy.orm"]
    trunk = [f"{rng.choice(modules)}:f{i}" for i in range(60)]
    stacks: set[str] = set()
    while len(stacks) < count:
        shared = rng.randint(8, 18)  # common prefix: the server loop, the framework
        depth = rng.randint(20, 50)
        frames = trunk[:shared] + [
            f"{rng.choice(modules)}:fn{rng.randint(0, 300)}" for _ in range(depth - shared)
        ]
        stacks.add(";".join(frames))
    return sorted(stacks)


def fleet_minutes(
    instances: int, stacks: int, active: int, start: int, end: int
) -> Iterator[list[SampleRow]]:
    """Yields each minute's rows of the collector benchmark's synthetic fleet."""
    rng = random.Random(1)
    pool = make_stacks(rng, stacks * 2)
    fleet = []
    for i in range(instances):
        fleet.append(
            (
                f"svc{i % 5}",
                f"host-{i // 2}",
                uuid.UUID(int=rng.getrandbits(128)).hex[:16],
                rng.sample(pool, stacks),
            )
        )
    weights = [1 / (rank + 1) ** 0.8 for rank in range(stacks)]
    labels = {"version": "1.4.2", "env": "prod"}
    for bucket in range(start, end, 60):
        rows = []
        for service, host, instance, own in fleet:
            picked = list(dict.fromkeys(rng.choices(own, weights, k=active * 2)))[:active]
            rows += [
                SampleRow(bucket, "cpu", service, host, instance, labels, s, rng.randint(1, 60))
                for s in picked
            ]
        yield rows


@contextmanager
def many_stacks(distinct: int) -> Iterator[tuple[str, int]]:
    """Yields a SQLite URL and the minute of an hour ago holding ``distinct`` distinct stacks."""
    rng = random.Random(2)
    stacks = make_stacks(rng, distinct)
    # A minute of an hour ago: a settled window, as when looking back at an incident.
    bucket = (int(time.time()) - 3600) // 60 * 60
    with database("sqlite") as url:
        store = Store(url)
        store.migrate()
        chunk = 50_000
        for i in range(0, len(stacks), chunk):
            store.write(
                SampleRow(bucket, "cpu", "api", "web-1", "i-1", {}, s, rng.randint(1, 100))
                for s in stacks[i : i + chunk]
            )
        store.close()
        yield url, bucket


def bench_server(args: argparse.Namespace) -> None:
    """Part 2: the same window's requests in-process, without a browser on the same cores."""
    cold, first, warmed, new, top_first, top_new = [], [], [], [], [], []
    with many_stacks(args.distinct) as (url, bucket):
        for _ in range(args.runs):
            app = create_app({"DATABASE_URL": url, "CACHE_ENTRIES": 0})
            client = app.test_client()
            for times, path, window in (
                (first, "flamegraph", 60),
                (new, "flamegraph", 61),
                (top_first, "top", 60),
                (top_new, "top", 61),
            ):
                query = f"/api/{path}?from={bucket}&to={bucket + window}"
                times.append(timed(lambda q=query, c=client: c.get(q).get_json()))
            app.extensions["fleetflame_db"].close()
            query = f"/api/flamegraph?from={bucket}&to={bucket + 60}"
            app = create_app({"DATABASE_URL": url, "CACHE_ENTRIES": 0})
            client = app.test_client()
            warm_up(app, client)
            warmed.append(timed(lambda q=query, c=client: c.get(q).get_json()))
            app.extensions["fleetflame_db"].close()
            app = create_app({"DATABASE_URL": url, "CACHE_ENTRIES": 0, "WARM_HOURS": 0})
            client = app.test_client()
            cold.append(timed(lambda q=query, c=client: c.get(q).get_json()))
            app.extensions["fleetflame_db"].close()
    print(f"  {args.distinct:,} distinct stacks in the window, in-process (Flask test client):")
    for name, times in (
        ("/api/flamegraph, fresh server, first view", first),
        ("/api/flamegraph, the same once warmed", warmed),
        ("/api/flamegraph, the same, warming off", cold),
        ("/api/flamegraph, a window not seen yet", new),
        ("/api/top, first time (frames split)", top_first),
        ("/api/top, a window not seen yet", top_new),
    ):
        print(f"  {name:<44} {statistics.median(times):7.0f} ms")


@contextmanager
def database(engine: str) -> Iterator[str]:
    """Yields the URL of an empty database on ``engine``, removed afterwards."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    name = f"fleetflame_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def warm_up(app: Flask, client: FlaskClient) -> None:
    """Opens the app's database as a load balancer's first health check does, and waits
    until its stack index has warmed."""
    assert client.get("/healthz").status_code == 200
    warmer = app.extensions["fleetflame_db"].warmer
    assert warmer is not None and warmer.wait(120) and warmer.learned > 0


def timed(fn: Callable[[], object]) -> float:
    """Returns the milliseconds ``fn`` took."""
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def verdict(ms: float, target: float) -> str:
    return f"target <= {target:g} ms ({ms / target:.2f}x) {'ok' if ms <= target else 'MISSED'}"


def bench_fleet(engine: str, args: argparse.Namespace) -> None:
    """Part 1: /api/flamegraph server time on the fleet, last hour and last 24 hours."""
    end = 1_800_000_000 // DAY * DAY + 10 * 3600
    start = end - args.hours * 3600
    with database(engine) as url:
        store = Store(url)
        store.migrate()
        written = 0
        began = time.monotonic()
        for rows in fleet_minutes(args.instances, args.stacks, args.active, start, end):
            store.write(rows)
            written += len(rows)
            bucket = rows[0].bucket
            if bucket % 3600 == 0:
                store.rollup(bucket)
        store.rollup(end + 180)
        store.close()
        print(f"  wrote {written:,} sample rows in {time.monotonic() - began:.0f} s")
        app = create_app({"DATABASE_URL": url, "CACHE_ENTRIES": 0})
        client = app.test_client()
        db = app.extensions["fleetflame_db"]
        windows = {"last hour": (end - 3600 + 120, end + 120), "24 hours": (end - DAY, end)}
        targets = {"last hour": TARGET_1H_MS, "24 hours": TARGET_24H_MS}
        for name, (frm, to) in windows.items():
            if to - frm > args.hours * 3600 + 240:
                frm = start
                name = f"{args.hours} hours"
            url_path = f"/api/flamegraph?from={frm}&to={to}"
            warm = client.get(url_path)  # warm the store's stack-name cache, as a server has
            assert warm.status_code == 200, warm.get_data(as_text=True)[:200]
            served = warm.get_json().get("total")
            queried = sum(db.query.profile(frm, to).values())
            print(f"    {name}: the API's total {served}, the store's {queried}")
            request_ms, query_ms, tree_ms = [], [], []
            stacks = 0
            for _ in range(args.runs):
                request_ms.append(timed(lambda p=url_path: client.get(p).get_json()))
                began_query = time.perf_counter()
                counts = db.query.profile(frm, to)
                query_ms.append(1000 * (time.perf_counter() - began_query))
                tree_ms.append(timed(lambda c=counts: flame_tree(c, max_nodes=5000)))
                stacks = len(counts)
            request = statistics.median(request_ms)
            query, tree = statistics.median(query_ms), statistics.median(tree_ms)
            target = targets.get(name, TARGET_24H_MS)
            print(
                f"  /api/flamegraph {name:<9} repeated view {request:6.1f} ms; a window not read "
                f"yet: store query {query:.1f} ms + pruned tree {tree:.1f} ms ({stacks:,} "
                f"distinct stacks), {verdict(query + tree, target)}"
            )
        db.close()


@contextmanager
def served(url: str) -> Iterator[tuple[Flask, str]]:
    """Yields a new web app over ``url`` and its base URL, served on a free port."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *args: object, **kwargs: object) -> None:
            pass

    app = create_app({"DATABASE_URL": url})
    httpd = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()
        app.extensions["fleetflame_db"].close()


def visit(page: Page, url: str) -> tuple[float, float, float, float, int]:
    """Opens ``url``; returns the milliseconds to a drawn flamegraph, of its /api/flamegraph
    request, of drawing it and of the /api/top request after it, and the frames drawn."""
    page.goto(url)
    page.wait_for_function(
        "() => performance.getEntriesByName('flamegraph-drawn').length", timeout=120_000
    )
    drawn, request, render = page.evaluate(
        "() => { const r = performance.getEntriesByType('resource')"
        ".find(e => e.name.includes('/api/flamegraph'));"
        " const d = performance.getEntriesByName('flamegraph-drawn')[0];"
        " return [d.startTime, r.responseEnd - r.requestStart, d.startTime - r.responseEnd] }"
    )
    frames = page.locator("#chart g.frame").count()
    # The page asks for its function table after drawing: let it finish, so the next case
    # starts on an idle server, and time that request.
    page.wait_for_load_state("networkidle")
    top = page.evaluate(
        "() => { const r = performance.getEntriesByType('resource')"
        ".find(e => e.name.includes('/api/top'));"
        " return r ? r.responseEnd - r.requestStart : NaN }"
    )
    page.close()
    return drawn, request, render, top, frames


def bench_browser(args: argparse.Namespace) -> None:
    """Part 3: navigation to a drawn flamegraph of a window with many distinct stacks."""
    cases = {
        "fresh": "fresh server, first view",
        "warmed": "the same once warmed",
        "new": "running server, a window not seen yet",
        "returning": "the same, browser has the page's files",
        "again": "the same view again (cached result)",
    }
    # Per case: milliseconds to drawn, of /api/flamegraph, of drawing, of /api/top.
    results: dict[str, list[tuple[float, ...]]] = {case: [] for case in cases}
    frames = 0
    with many_stacks(args.distinct) as (url, bucket), sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        viewport = {"width": 1400, "height": 900}
        for run in range(args.runs):
            windows = {
                "fresh": f"from={bucket}&to={bucket + 60}",
                "new": f"from={bucket}&to={bucket + 61}",  # same data, not cached
                "returning": f"from={bucket}&to={bucket + 62}",
                "again": f"from={bucket}&to={bucket + 62}",
            }
            # A browser that opened the UI before has its static files (kept a year):
            # "fresh" is its first visit, "returning" and "again" come later. "new" is
            # another browser's first visit.
            with served(url) as (_, base):
                visitor = browser.new_context(viewport=viewport)
                for case, window in windows.items():
                    if case == "new":
                        page = browser.new_page(viewport=viewport)
                    else:
                        page = visitor.new_page()
                    *times, frames = visit(page, f"{base}/?{window}")
                    results[case].append(tuple(times))
                visitor.close()
            # A server restarted a while ago: a health check opened its database, and its
            # stack index has warmed. A browser's first visit.
            with served(url) as (app, base):
                warm_up(app, app.test_client())
                *times, frames = visit(
                    browser.new_page(viewport=viewport), f"{base}/?{windows['fresh']}"
                )
                results["warmed"].append(tuple(times))
            print(
                f"    run {run + 1}: "
                + ", ".join(f"{case} {results[case][-1][0]:.0f} ms" for case in cases)
                + f"; {frames} frames wide enough to draw",
                flush=True,
            )
        browser.close()
    print(f"  {args.distinct:,} distinct stacks in the window, max_nodes 5000:")
    for case, title in cases.items():
        drawn, server, render, top = map(statistics.median, zip(*results[case], strict=True))
        print(
            f"  navigation -> drawn, {title:<39} {drawn:7.0f} ms "
            f"(/api/flamegraph {server:5.0f} ms, then drawing {render:4.0f} ms)  "
            f"{verdict(drawn, TARGET_DRAW_MS)}; the function table after it: /api/top "
            f"{top:.0f} ms"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite", help="sqlite,postgresql")
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--stacks", type=int, default=2000, help="distinct stacks per instance")
    parser.add_argument("--active", type=int, default=200, help="stacks with samples per minute")
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--distinct", type=int, default=200_000, help="stacks in the browser test")
    parser.add_argument("--runs", type=int, default=5, help="runs of each measurement (median)")
    parser.add_argument("--quick", action="store_true", help="10 instances, 3 h, 50,000 stacks")
    parser.add_argument("--skip-fleet", action="store_true")
    parser.add_argument("--skip-browser", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.hours, args.distinct, args.runs = 10, 3, 50_000, 3
    if not args.skip_fleet:
        print(
            f"fleet: {args.instances} instances x {args.stacks} stacks, {args.active} active per "
            f"minute, {args.hours} h; medians of {args.runs} runs"
        )
        for engine in args.engines.split(","):
            print(f"== {engine}", flush=True)
            bench_fleet(engine, args)
    if not args.skip_browser:
        print(f"== server only, medians of {args.runs} runs", flush=True)
        bench_server(args)
        print(f"== browser (headless Chromium), medians of {args.runs} runs", flush=True)
        bench_browser(args)


if __name__ == "__main__":
    main()
