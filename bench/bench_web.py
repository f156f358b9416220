"""Benchmark of the web UI on a window of 200,000 distinct stacks: /api/flamegraph and
/api/top through a real ``fleetflame web``, and the time from navigation to a drawn
flamegraph in headless Chromium, on a freshly started server and on a running one.

1. Server: a ``fleetflame web`` subprocess over the window's database. On a fresh server
   (asked as soon as it answers /healthz, its stack index cold: the first start on this
   database, no index file saved), then on the same server for new windows (never asked
   before): /api/flamegraph and /api/top, the server's CPU time, and its memory; then on a
   restarted server, asked as soon as it answers, that loads the index file the first one
   saved, from which 1% of the window's stacks are taken out (as when they were first
   sampled after the file was saved: the request reads them, and the tree's node
   boundaries are all new); and on one restarted with the whole files, asked as soon as it
   has warmed.
2. Browser: navigation to a drawn flamegraph (a performance mark after the first frame with
   the graph) on a fresh server, for a window not seen yet, from a browser that has the
   page's files, for the same view again; then on restarted servers: with the index file
   holding every stack of the window, lacking 1% of them, and once warmed.

Each case is run --runs times on new servers; medians, and their ratio to the targets: the
first view of a fresh server <= 1 s to a drawn graph, /api/top <= 300 ms for a new window.
The fleet's windows (1 hour to 30 days) are bench/bench_store.py's.

    python bench/bench_web.py                       # SQLite, 200,000 stacks, 3 runs
    python bench/bench_web.py --engines sqlite,postgresql --scales 1,10
    python bench/bench_web.py --quick               # 50,000 stacks
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchfleet import WebServer, database, load_average, make_stacks, median, verdict
from headless import launch_chromium
from playwright.sync_api import Page, sync_playwright

from collector.store import SampleRow, Store
from webui import indexfile

TARGET_DRAW_MS = 1000
TARGET_TOP_MS = 300


@contextmanager
def many_stacks(distinct: int, engine: str = "sqlite") -> Iterator[tuple[str, int]]:
    """Yields a database URL and the minute of an hour ago holding ``distinct`` distinct
    stacks (one series: a worker with a very varied profile)."""
    rng = random.Random(2)
    stacks = make_stacks(rng, distinct)
    # A minute of an hour ago: a settled window, as when looking back at an incident.
    bucket = (int(time.time()) - 3600) // 60 * 60
    with database(engine) as url:
        store = Store(url)
        store.migrate()
        chunk = 50_000
        for i in range(0, len(stacks), chunk):
            store.write(
                SampleRow(bucket, "cpu", "api", "web-1", "i-1", {}, s, rng.randint(1, 100))
                for s in stacks[i : i + chunk]
            )
        store.rollup(bucket + 3600)
        store.close()
        yield url, bucket


def drop_from_index_file(index_dir: str, share: float) -> None:
    """Takes ``share`` of the stacks out of the index file saved in ``index_dir``, spread
    over the order, as if they had first been sampled after it was saved."""
    (path,) = Path(index_dir).glob("stacks-*.idx")
    keys, ids = indexfile.load(path)
    step = round(1 / share)
    kept = [i for i in range(len(keys)) if i % step]
    indexfile.save(path, [keys[i] for i in kept], [ids[i] for i in kept])


def bench_server(url: str, bucket: int, runs: int) -> dict[str, list[float]]:
    """Part 1: the requests of a fresh server, then of the same server for new windows, then
    of a restarted one that loads the index file the first saved, lacking 1% of it."""
    out: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    def first_requests(server: WebServer, case: str) -> None:
        """The graph and the table of the first window, asked as soon as the server answers."""
        server.wait()
        ms, cpu, _ = server.get(f"/api/flamegraph?from={bucket}&to={bucket + 60}")
        note(f"flamegraph, {case}", ms)
        note(f"flamegraph, {case}, server CPU", cpu)
        ms, cpu, _ = server.get(f"/api/top?from={bucket}&to={bucket + 60}")
        note(f"top, {case}", ms)

    for run in range(runs):
        index_dir = tempfile.TemporaryDirectory()
        with WebServer(url, index_dir=index_dir.name) as server:
            first_requests(server, "fresh server (no index file)")
            server.warmed()
            for k in range(3):  # windows with the same stacks, never asked before
                window = f"from={bucket}&to={bucket + 61 + k + 10 * run}"
                ms, cpu, _ = server.get(f"/api/flamegraph?{window}")
                note("flamegraph, new window", ms)
                note("flamegraph, new window, server CPU", cpu)
                ms, cpu, _ = server.get(f"/api/top?{window}")
                note("top, new window", ms)
                note("top, new window, server CPU", cpu)
            rss, peak = server.memory_mb()
            note("server memory, MB", rss)
            note("server peak memory, MB", peak)
            if not server.logged("function index saved"):  # saved after the stack index
                raise RuntimeError("the server did not save its indexes")
        whole = tempfile.TemporaryDirectory()
        shutil.copytree(index_dir.name, whole.name, dirs_exist_ok=True)
        drop_from_index_file(index_dir.name, 0.01)
        with WebServer(url, index_dir=index_dir.name) as server:
            first_requests(server, "restarted, index files (stacks lacking 1%)")
        # Restarted with files holding everything, asked the moment warming has taken them in
        # (it then writes nothing: it learned nothing).
        with WebServer(url, index_dir=whole.name) as server:
            server.wait()
            if not server.warmed():
                raise RuntimeError("the server did not warm")
            ms, cpu, _ = server.get(f"/api/flamegraph?from={bucket}&to={bucket + 60}")
            note("flamegraph, restarted, once warmed", ms)
            note("flamegraph, restarted, once warmed, server CPU", cpu)
        index_dir.cleanup()
        whole.cleanup()
    return out


def visit(page: Page, url: str) -> tuple[float, float, float]:
    """Opens ``url``; returns the milliseconds to a drawn flamegraph, of its /api/flamegraph
    request, and of the /api/top request after it."""
    page.goto(url)
    page.wait_for_function(
        "() => performance.getEntriesByName('flamegraph-drawn').length", timeout=120_000
    )
    drawn, request = page.evaluate(
        "() => { const r = performance.getEntriesByType('resource')"
        ".find(e => e.name.includes('/api/flamegraph'));"
        " const d = performance.getEntriesByName('flamegraph-drawn')[0];"
        " return [d.startTime, r.responseEnd - r.requestStart] }"
    )
    # The page asks for its function table after drawing: let it finish, and time it.
    page.wait_for_load_state("networkidle")
    top = page.evaluate(
        "() => { const r = performance.getEntriesByType('resource')"
        ".find(e => e.name.includes('/api/top'));"
        " return r ? r.responseEnd - r.requestStart : NaN }"
    )
    page.close()
    return drawn, request, top


def bench_browser(url: str, bucket: int, runs: int) -> dict[str, list[tuple[float, ...]]]:
    """Part 2: navigation to a drawn flamegraph in headless Chromium."""
    results: dict[str, list[tuple[float, ...]]] = {}
    viewport = {"width": 1400, "height": 900}
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        for run in range(runs):
            windows = {
                "fresh server, first view": f"from={bucket}&to={bucket + 60}",
                "running server, a window not seen yet": f"from={bucket}&to={bucket + 61}",
                "the same, browser has the page's files": f"from={bucket}&to={bucket + 62}",
                "the same view again (cached result)": f"from={bucket}&to={bucket + 62}",
            }
            first = windows["fresh server, first view"]
            index_dir = tempfile.TemporaryDirectory()
            # The server starts as the browser comes: asked the moment it answers. Its first
            # start on this database: no index file saved yet.
            with WebServer(url, index_dir=index_dir.name) as server:
                server.wait()
                visitor = browser.new_context(viewport=viewport)
                for case, window in windows.items():
                    fresh_browser = case.startswith("running")
                    page = browser.new_page(viewport=viewport) if fresh_browser else None
                    page = page or visitor.new_page()
                    results.setdefault(case, []).append(visit(page, f"{server.base}/?{window}"))
                visitor.close()
                if not server.logged("function index saved"):  # saved after the stack index
                    raise RuntimeError("the server did not save its indexes")
            # Restarted: asked the moment it answers, as it loads the index file the last
            # one saved; then with 1% of the window's stacks taken out of the file.
            for case in ("restarted, index file holding the window", "restarted, file lacking 1%"):
                if "lacking" in case:
                    drop_from_index_file(index_dir.name, 0.01)
                with WebServer(url, index_dir=index_dir.name) as server:
                    server.wait()
                    page = browser.new_page(viewport=viewport)
                    results.setdefault(case, []).append(visit(page, f"{server.base}/?{first}"))
            # A server restarted a while ago: its stack index warmed. A browser's first visit.
            with WebServer(url, index_dir=index_dir.name) as server:
                server.wait()
                server.warmed()
                page = browser.new_page(viewport=viewport)
                results.setdefault("restarted server, once warmed", []).append(
                    visit(page, f"{server.base}/?{first}")
                )
            index_dir.cleanup()
            print(f"    run {run + 1}: " + ", ".join(
                f"{case} {times[-1][0]:.0f} ms" for case, times in results.items()
            ), flush=True)  # fmt: skip
        browser.close()
    return results


def report(engine: str, distinct: int, server: dict, browser: dict) -> None:
    print(f"== {engine}: {distinct:,} distinct stacks in the window; load average "
          f"{load_average()}")  # fmt: skip
    targets = {"top, new window": TARGET_TOP_MS}
    for name, values in server.items():
        unit = "" if "memory" in name else " ms"
        line = f"  {name:<44} {median(values):8.0f}{unit}"
        if targets.get(name):
            line += f"  {verdict(median(values), targets[name])}"
        print(line)
    for case, runs in browser.items():
        drawn, request, top = (median(list(v)) for v in zip(*runs, strict=True))
        line = (f"  navigation -> drawn, {case:<40} {drawn:7.0f} ms (/api/flamegraph "
                f"{request:5.0f} ms; /api/top after it {top:5.0f} ms)")  # fmt: skip
        if case == "fresh server, first view" or case.startswith("restarted, "):
            line += f"  {verdict(drawn, TARGET_DRAW_MS)}"
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite", help="sqlite,postgresql")
    parser.add_argument("--scales", default="1", help="sizes of the window, times --distinct")
    parser.add_argument("--distinct", type=int, default=200_000, help="stacks in the window")
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (median)")
    parser.add_argument("--quick", action="store_true", help="50,000 stacks")
    parser.add_argument("--skip-browser", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.distinct = 50_000
    for scale in map(int, args.scales.split(",")):
        for engine in args.engines.split(","):
            distinct = args.distinct * scale
            with many_stacks(distinct, engine) as (url, bucket):
                server = bench_server(url, bucket, args.runs)
                browser = {} if args.skip_browser else bench_browser(url, bucket, args.runs)
            report(engine, distinct, server, browser)


if __name__ == "__main__":
    main()
