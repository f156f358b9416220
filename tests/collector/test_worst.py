"""Worst cases end to end: a real worker's stalls and requests, polled, stored and served.

The worker runs the sampler with no change but ``sampler.start()``: an asyncio loop with a
planted 100 ms blocking call (three times), and a WSGI app with the middleware answering 400
requests on 40 paths, 10 of which spend 40 ms in a planted slow path. The collector's worst-cases job reads
it into a real database (SQLite and PostgreSQL); the web UI's API must then show each planted
stall once, lasting 100 ms to within 20%, with the planted call in its stacks, and the route's
requests with their percentiles and the slow path in the slowest 1%'s stacks.
"""

import json
import socket
import time

import pytest
import sqlalchemy as sa
from pollhelpers import ready_worker

from collector.store import Store, schema
from collector.targets import Target
from collector.worst import WorstCases
from collector.worst_documents import sketch_delta
from collector.worst_rows import add_fleet_rows, add_request_rows
from sampler._engine_native import unavailable
from sampler._sketch import Sketch

NATIVE = unavailable() is None

WORKER = r"""
import asyncio, sys, time, wsgiref.util
import sampler, sampler.middleware

s = sampler.start(port=int(sys.argv[1]), service="shop", labels={"version": "1.0"})


def planted_blocking_call():
    time.sleep(0.1)


async def handle_order():
    planted_blocking_call()


async def main():
    for _ in range(3):
        await asyncio.sleep(0.02)
        await handle_order()
    await asyncio.sleep(0.05)

asyncio.run(main())


def planted_slow_path():
    end = time.thread_time() + 0.04
    while time.thread_time() < end:
        pass


def app(environ, start_response):
    if environ["PATH_INFO"].endswith("/7"):
        planted_slow_path()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


wrapped = sampler.middleware.WSGIMiddleware(app)
for i in range(400):
    environ = {"PATH_INFO": f"/orders/{i % 40}", "REQUEST_METHOD": "GET"}
    wsgiref.util.setup_testing_defaults(environ)
    body = wrapped(environ, lambda *a: None)
    list(body)
    body.close()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def worker():
    with ready_worker(WORKER) as (_, port):
        time.sleep(0.5)  # the recorder's batch
        yield Target("127.0.0.1", port)


@pytest.mark.alone
def test_stalls_and_requests_are_stored_once_and_served(worker, db_url):
    store = Store(db_url)
    store.migrate()
    worst = WorstCases(store)
    try:
        # A second back: the rows' minute starts before the web UI's "now", even when that is
        # the first second of a minute (the window [now - 1h, now) left out the minute that
        # started at "now" once, and the routes with it).
        now = time.time() - 2
        first = worst.poll([worker], now)
        again = worst.poll([worker], now + 1)  # nothing new: nothing stored twice
    finally:
        worst.close()
        store.close()
    assert first["stalls"] >= 3 and first["request_buckets"] == 40
    # Nothing stored twice: no request bucket again, and check_served finds the 3 planted
    # stalls once each. A stall may still be new in the second poll (one was, once, on a
    # loaded machine: the worker's threads can stall between the polls too).
    assert again["request_buckets"] == 0 and again["stalls"] <= 2

    from webui import create_app

    app = create_app({"DATABASE_URL": db_url})
    try:
        check_served(app.test_client())
    finally:
        app.extensions["fleetflame_db"].close()


def check_served(client):
    stalls = client.get("/api/stalls", query_string={"from": "-1h", "service": "shop"}).json
    planted = [
        s
        for s in stalls["stalls"]
        if any("planted_blocking_call" in k for k in s["stacks"]["wall"])
    ]
    assert len(planted) == 3, [(s["what"], s["duration"]) for s in stalls["stalls"]]
    for stall in planted:
        assert stall["kind"] == "event-loop" and stall["what"] == "a step of task main"
        assert stall["duration"] == pytest.approx(0.1, rel=0.2)
        assert stall["service"] == "shop"
    assert stalls["count"] == len(stalls["stalls"]) >= 3
    assert stalls["buckets"][0]["max"] == pytest.approx(
        max(s["duration"] for s in planted), abs=1e-3
    )
    names = json.dumps(stalls["flamegraph"]["tree"])
    assert "planted_blocking_call" in names
    other = client.get("/api/stalls", query_string={"from": "-1h", "service": "nope"}).json
    assert other["count"] == 0 and other["stalls"] == []

    routes = client.get("/api/requests", query_string={"from": "-1h"}).json["routes"]
    by_route = {r["route"]: r for r in routes}
    slow = by_route["/orders/7"]
    assert slow["count"] == 10 and slow["latency"]["p50"] >= 0.04 * 0.99
    assert sum(r["count"] for r in routes) == 400
    assert len(slow["slowest"]) == 5
    assert all(r["path"] == "/orders/7" and r["duration"] >= 0.04 for r in slow["slowest"])
    assert {r["host"] for r in slow["slowest"]} == {socket.gethostname()}  # where each ran
    if NATIVE:  # the slowest requests' stacks come from the native engine's recent samples
        assert all(any("planted_slow_path" in k for k in r["stacks"]) for r in slow["slowest"])
    fast = by_route["/orders/8"]
    assert fast["count"] == 10 and fast["latency"]["max"] < 0.04
    bad = client.get("/api/stalls", query_string={"from": "9" * 400})
    assert bad.status_code == 400 and bad.json["param"] == "from"


def test_a_sketch_delta_holds_what_was_added_between_two_reads():
    before, after = Sketch(), Sketch()
    for value in (0.001, 0.002, 0.003):
        before.add(value)
        after.add(value)
    for value in (0.5, 0.002):
        after.add(value)
    delta = sketch_delta(after, before)
    assert delta.count == 2 and delta.max == 0.5
    assert sum(delta.bins.values()) == 2
    assert delta.quantile(1.0) == pytest.approx(0.5, rel=0.01)


@pytest.mark.browser
@pytest.mark.alone
def test_the_worst_cases_page_shows_the_planted_stall_and_the_routes(worker, tmp_path):
    import threading

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from webui import create_app

    url = f"sqlite:///{tmp_path / 'fleetflame.db'}"
    store = Store(url)
    store.migrate()
    worst = WorstCases(store)
    try:
        worst.poll([worker], time.time())
    finally:
        worst.close()
        store.close()
    app = create_app({"DATABASE_URL": url})
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    errors = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{httpd.server_port}/worst?from=-1h&service=shop")
            page.wait_for_selector("body[data-state=ready], body[data-state=error]")
            assert errors == [] and page.locator("#status").inner_text() == ""
            rows = page.locator("#stalls tbody tr")
            assert rows.count() >= 3
            first = rows.first.inner_text()  # the longest first
            assert "a step of task main" in first and "event-loop" in first
            page.wait_for_selector("#stall-chart g.frame[name='__main__:planted_blocking_call']")
            route_rows = page.locator("#routes tbody tr")
            assert route_rows.count() == 40
            assert "/orders/7" in route_rows.first.inner_text()  # the slowest p99 first
            # Each route's slowest requests, slowest first, and what one was doing.
            slowest = page.locator("#slowest tbody tr")
            assert slowest.count() == 5 * 40
            assert "/orders/7" in slowest.first.inner_text()
            slowest.first.click()
            if NATIVE:
                page.wait_for_selector("#slowest-chart g.frame[name='__main__:planted_slow_path']")
            route_rows.nth(3).click()  # a route of its own: only its requests
            page.wait_for_function(
                "() => document.querySelectorAll('#slowest tbody tr').length === 5"
            )
            assert "The slowest requests of /orders/" in page.locator("#slowest-title").inner_text()
            browser.close()
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
        app.extensions["fleetflame_db"].close()
    assert errors == []


def route_part(bins):
    sketch = {"alpha": 0.01, "min_value": 1e-06, "count": 1, "sum": 0.1, "max": 0.1, "zero": 0}
    return {
        "count": 1,
        "errors": 0,
        **{name: {**sketch, "bins": bins} for name in ("latency", "queue", "total")},
        "slow": {"count": 0, "stacks": {}},
        "slowest": [],
    }


def poll_once(url, server):
    """One read of ``server`` by the worst-cases job into the store at ``url``."""
    store = Store(url)
    store.migrate()
    worst = WorstCases(store)
    try:
        return worst.poll([Target("127.0.0.1", server.port)], time.time())
    finally:
        worst.close()
        store.close()


def serving_requests(servers, document):
    """A worker answering ``document`` (read again at each request) as its /requests.json,
    and no stalls."""

    def answer(handler):
        body = json.dumps(document if "requests" in handler.path else {"stalls": []}).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    server = servers()
    server.behaviour = answer
    return server


def test_a_route_no_sampler_sends_is_skipped_and_the_others_stored(servers, logs, sqlite_url):
    # A bin a billion indices up would pack into an endless row, and a count of 2**63 would
    # carry into the next bin when merged: those routes are refused, the others stored.
    routes = {
        "/far": route_part([[10**9, 1]]),
        "/huge": {**route_part([[-230, 2**63]]), "count": 2**63},
        "/fine": route_part([[-230, 1]]),
    }
    for part in routes.values():
        for name in ("latency", "queue", "total"):
            part[name]["count"] = part["count"]
    document = {"format": "fleetflame.requests/1", "series": "s1", "routes": routes}
    server = serving_requests(servers, document)
    assert poll_once(sqlite_url, server)["request_buckets"] == 1
    skipped = logs.matching("level=warning", "route in /requests.json is malformed")
    assert len(skipped) == 2
    assert any("route=/far" in line and "index" in line for line in skipped)
    assert any("route=/huge" in line for line in skipped)
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as conn:
        stored_routes = conn.execute(sa.select(schema.request_buckets.c.route)).scalars().all()
    engine.dispose()
    assert stored_routes == ["/fine"]


def test_every_route_a_sampler_sends_is_kept_other_and_unmatched_too(servers, logs, sqlite_url):
    # A sampler names 200 routes, then counts the rest as [other], beside [unmatched]: the
    # collector kept the first 200 it read, and [other] comes last.
    names = [f"/r{i}" for i in range(200)] + ["[unmatched]", "[other]"]
    routes = {name: route_part([[-230, 1]]) for name in names}
    document = {"format": "fleetflame.requests/1", "series": "s1", "routes": routes}
    stored = poll_once(sqlite_url, serving_requests(servers, document))
    assert stored["request_buckets"] == 202
    assert not logs.matching("more routes than")


@pytest.mark.alone
def test_what_a_failed_write_read_is_read_again_when_the_database_is_back(worker, pg_url):
    from storehelpers import TcpProxy

    from collector.store import StoreUnavailable

    proxy = TcpProxy(target_port=5432)
    proxy.start()
    store = Store(pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), connect_timeout=2)
    store.migrate()
    worst = WorstCases(store)
    try:
        now = time.time() - 2
        proxy.stop()  # the database goes away as the stalls and requests are read
        with pytest.raises(StoreUnavailable):
            worst.poll([worker], now)
        proxy.start()
        stored = worst.poll([worker], now + 1)
    finally:
        worst.close()
        store.close()
        proxy.stop()
    # Before, the failed write's reads counted as seen: none of it came again.
    assert stored["stalls"] >= 3 and stored["request_buckets"] == 40


def test_malformed_slowest_requests_cost_only_themselves(servers, logs, sqlite_url):
    # Entries that are no request (not an object, no id, an id that cannot be compared, a
    # duration that is no number) are left out; the good one is kept, and a second read in
    # the same minute (the job reads every 30 s) merges with the first: it used to fail the
    # whole write of every target, or drop the worker's routes until it restarted.
    good = {"id": 7, "start": 1.5, "duration": 0.25, "queue": None, "thread": "t",
            "status": 200, "path": "/p", "stacks": {"m;slow": 3, "m;bad": "x"}}  # fmt: skip
    part = route_part([[-230, 1]])
    part["slowest"] = [good, "no", {"duration": 1.0}, {"id": [1], "duration": 2.0, "start": 1},
                       {"id": 8, "duration": "long", "start": 1, "stacks": {}}]  # fmt: skip
    document = {"format": "fleetflame.requests/1", "series": "s1", "routes": {"/r": part}}
    server = serving_requests(servers, document)
    store = Store(sqlite_url)
    store.migrate()
    worst = WorstCases(store)
    target = Target("127.0.0.1", server.port)
    try:
        assert worst.poll([target], time.time())["request_buckets"] == 1
        part["count"] += 1  # the same minute, read again: merged with the first row
        for name in ("latency", "queue", "total"):
            part[name].update(count=part[name]["count"] + 1, bins=[[-230, 2]])
        part["slowest"].append({**good, "id": 9, "duration": 0.5})
        worst.poll([target], time.time())
    finally:
        worst.close()
        store.close()
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as conn:
        (slow,) = conn.execute(sa.select(schema.request_buckets.c.slow)).scalars().all()
    engine.dispose()
    slowest = json.loads(slow)["slowest"]
    assert [(r["id"], r["duration"]) for r in slowest] == [(9, 0.5), (7, 0.25)]
    assert slowest[1]["stacks"] == {"m;slow": 3.0}
    assert not logs.matching("level=warning", "route in /requests.json is malformed")


def test_an_unreadable_stored_row_is_replaced_and_the_window_still_answers(sqlite_url, logs):
    from collector.request_rows import SKETCHES, pack_sketch
    from webui import create_app

    store = Store(sqlite_url)
    store.migrate()
    store.close()
    sketch = Sketch()
    sketch.add(0.01)
    row = {
        "bucket": 1_800_000_000 - 60,
        "instance": "i",
        "route": "/r",
        "service": "shop",
        "host": "h",
        "count": 1,
        "errors": 0,
        "sketches": json.dumps({name: pack_sketch(sketch) for name in SKETCHES}),
        "slow": json.dumps({"count": 0, "stacks": {}, "slowest": []}),
    }
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        add_request_rows(conn, [row])
        # Damaged by hand: a minute row of another route, and the merged day row of this one.
        conn.execute(
            schema.request_buckets.insert(), [{**row, "route": "/other", "sketches": "{}"}]
        )
        conn.execute(
            schema.request_fleet.update()
            .where(schema.request_fleet.c.width == 86400)
            .values(sketches='{"latency": 1}')
        )
        add_request_rows(conn, [{**row, "bucket": row["bucket"] + 60 - 120}])
        add_fleet_rows(conn, [{**row, "route": "/other", "sketches": "{}"}])  # as 0008 would
        day = conn.execute(
            sa.select(schema.request_fleet.c.count).where(schema.request_fleet.c.width == 86400)
        ).scalar_one()
    engine.dispose()
    assert day == 1  # replaced by what was added to it
    assert logs.matching("level=warning", "unreadable request row left out", "width=86400")
    assert logs.matching("level=warning", "unreadable request row left out", "route=/other")
    app = create_app({"DATABASE_URL": sqlite_url, "WARM_HOURS": 0})
    try:
        window = "from=1799996400&to=1800000000&host=h"
        answer = app.test_client().get(f"/api/requests?{window}").get_json()
    finally:
        app.extensions["fleetflame_db"].close()
    assert answer["unreadable_rows"] == 1
    assert [(r["route"], r["count"]) for r in answer["routes"]] == [("/r", 2)]
