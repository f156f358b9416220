"""Shared data of the web UI tests: a small fleet profile and the counts it should give."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from collector.store import SampleRow, Store

T0 = 1_700_000_000 // 86400 * 86400  # a UTC midnight: every tier boundary falls on it
# Markup, and a right-to-left override that would show "gnp.exe" as "exe.png".
XSS = "<img src=x onerror=alert(1)>\u202egnp.exe"
TIMEOUT = 30_000  # ms, a browser test's waits: the machine is shared, so be patient, not flaky

# (service, host, version) -> {stack: count per minute}
FLEET = {
    ("api", "web-1", "1.4.1"): {
        "__main__:<module>;app:serve;app:handle;json:dumps": 6,
        "__main__:<module>;app:serve;app:handle;app:render": 3,
        f"__main__:<module>;app:serve;{XSS}": 1,
    },
    ("api", "web-2", "1.4.2"): {
        "__main__:<module>;app:serve;app:handle;json:dumps": 2,
        "__main__:<module>;app:serve;app:handle;app:render": 8,
        "__main__:<module>;app:serve;m:semi%3Bcolon": 1,
    },
    ("worker", "job-1", "1.4.2"): {"__main__:<module>;jobs:run;jobs:resize": 5},
}
MINUTES = 60


def fleet_rows(minutes: int = MINUTES, start: int = T0) -> list[SampleRow]:
    """Returns one row per (minute, series, stack) of FLEET."""
    rows = []
    for minute in range(minutes):
        for (service, host, version), stacks in FLEET.items():
            for stack, count in stacks.items():
                rows.append(
                    SampleRow(
                        start + 60 * minute,
                        "cpu",
                        service,
                        host,
                        f"{host}-i",
                        {"version": version, "route": '/up"load'},
                        stack,
                        count,
                    )
                )
    return rows


def expected(minutes: int = MINUTES, **match: str) -> dict[str, int]:
    """The merged folded counts of FLEET over ``minutes`` for series matching ``match``."""
    out: dict[str, int] = {}
    for (service, host, version), stacks in FLEET.items():
        series = {"service": service, "host": host, "version": version}
        if any(series[k] != v for k, v in match.items()):
            continue
        for stack, count in stacks.items():
            out[stack] = out.get(stack, 0) + count * minutes
    return out


def record_finding(url: str, function: str, b_from: int, b_to: int, **fields: object) -> None:
    """Writes one finding of the collector's scheduled comparison into the store at ``url``,
    as the findings job records it (its B window [b_from, b_to), side A the hour before)."""
    import sqlalchemy as sa

    from collector.store import schema

    row = {
        "id": abs(hash((function, b_from))) % 2**62, "found_at": float(b_to),
        "service": "api", "function": function, "kind": "self", "a_share": 10.0,
        "b_share": 13.0, "change": 3.0, "ci_low": 2.5, "ci_high": 3.5, "q": 0.001,
        "compared": "version 1.4.1 -> 1.4.2", "a_from": b_from - 3600, "a_to": b_from,
        "b_from": b_from, "b_to": b_to, "a_label": "version:1.4.1", "b_label": "version:1.4.2",
        "link": "/compare", "sent": 0, **fields,
    }  # fmt: skip
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(schema.findings.insert(), [row])
    engine.dispose()


@contextmanager
def client_over(
    path: Any, rows: Iterable[SampleRow], then: Callable[[str], None] = lambda url: None
) -> Iterator[Any]:
    """A test client of the web app over a new SQLite file at ``path`` holding ``rows``
    (``then`` is called with the database URL before the app starts, to add more)."""
    from webui import create_app

    url = f"sqlite:///{path}"
    store = Store(url)
    store.migrate()
    store.write(rows)
    store.close()
    then(url)
    app = create_app({"DATABASE_URL": url})
    # Warming done and its thread gone first: a module's client outlives a test, and no
    # fleetflame thread may (tests/conftest.py), however slowly a loaded machine warms.
    db = app.extensions["fleetflame_db"]
    db.open()
    if db.warmer is not None:
        db.warmer.wait(60)
        db.warmer.stop()
    try:
        yield app.test_client()
    finally:
        app.extensions["fleetflame_db"].close()


def record_stalls(
    url: str, stalls: Iterable[tuple[float, float]], stacks: dict[str, Any] | None = None
) -> None:
    """Writes stall events (start, duration in seconds) of an event loop of service api into
    the store at ``url``, as the collector's worst-cases job stores them, each with ``stacks``
    (by default one wall stack in time.sleep)."""
    import json

    import sqlalchemy as sa

    from collector.store import schema

    if stacks is None:
        stacks = {"wall": {"main;app:handle;time:sleep": 1.0}, "cpu": {}}
    stored = json.dumps(stacks)
    rows = [
        {
            "id": i + 1,
            "start": start,
            "duration": duration,
            "service": "api",
            "host": "web-1",
            "instance": "web-1-i",
            "kind": "event-loop",
            "thread": "MainThread",
            "what": "a step of task main",
            "stacks": stored,
        }  # fmt: skip
        for i, (start, duration) in enumerate(stalls)
    ]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(schema.stall_events.insert(), rows)
    engine.dispose()


def record_slow_requests(
    url: str, route: str, stacks: dict[str, float], buckets: list[int]
) -> None:
    """Writes a route's request figures (100 requests a bucket, one of them slow, with the
    stacks given) for each of ``buckets`` into the store at ``url``, as the worst-cases job
    stores them."""
    import json

    import sqlalchemy as sa

    from collector.request_rows import SKETCHES
    from collector.worst_rows import add_request_rows
    from sampler._sketch import Sketch

    latency = Sketch()
    for ms in range(1, 101):  # 100 requests of 1 to 100 ms
        latency.add(ms / 1000)
    documents = {name: (latency if name == "latency" else Sketch()).document() for name in SKETCHES}
    sketches = json.dumps(documents)
    slow = json.dumps({"count": 1, "stacks": stacks, "slowest": []})
    rows = [
        {
            "bucket": bucket,
            "instance": "i",
            "route": route,
            "service": "shop",
            "host": "h",
            "count": 100,
            "errors": 0,
            "sketches": sketches,
            "slow": slow,
        }
        for bucket in buckets
    ]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        add_request_rows(conn, rows)
    engine.dispose()


@contextmanager
def serving(url: str) -> Iterator[str]:
    """The web app on a free port over the database at ``url``, with no warming thread (one
    still running at a test's end would fail it); yields its base URL."""
    from werkzeug.serving import make_server

    from webui import create_app

    app = create_app({"DATABASE_URL": url, "WARM_HOURS": 0, "INDEX_DIR": ""})
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
        app.extensions["fleetflame_db"].close()


def open_view(page, url: str) -> None:
    """Opens a page of the web UI and waits until it has drawn what it shows."""
    page.goto(url)
    page.wait_for_selector("body[data-state=ready]")


def frame(page, name: str):
    """The graph's frame of that (shown) name."""
    return page.locator("#chart g.frame").filter(
        has=page.locator(f"xpath=self::*[@name={xpath_literal(name)}]")
    )


def xpath_literal(text: str) -> str:
    """``text`` as an XPath string literal, which has no escapes: quotes split it in concat()."""
    if "'" not in text:
        return f"'{text}'"
    return "concat('" + "', \"'\", '".join(text.split("'")) + "')"
