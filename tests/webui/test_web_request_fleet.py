"""Request figures of the fleet (issue 16): a window reads every instance's requests already
merged per service and route, by the day, hour, ten minutes and minute, and answers as the
minute rows of every instance do."""

import json
import random

import pytest
import sqlalchemy as sa
from webhelpers import T0

from collector.request_rows import SKETCHES
from collector.store import Store, schema
from collector.worst import WorstCases
from collector.worst_rows import MAX_FLEET_STACKS, add_request_rows
from sampler._sketch import Sketch
from sampler.profile import OTHER
from webui import create_app, worst

ROUTES = ("/orders/<id>", "/search")
INSTANCES = ("i-1", "i-2", "i-3")
STORED = range(-30, 3 * 60 + 30)  # minutes from T0: 30 either side of three hours


def minute_rows(bucket, rng):
    """What the worst-cases job stores for one minute: a row per instance and route."""
    rows = []
    for instance in INSTANCES:
        for route in ROUTES:
            latency, queue, total = Sketch(), Sketch(), Sketch()
            for _ in range(20):
                seconds = rng.lognormvariate(-4, 1)
                latency.add(seconds)
                queue.add(seconds / 10)
                total.add(seconds * 1.1)
            sketches = {"latency": latency, "queue": queue, "total": total}
            slow = {
                "count": 1,
                "stacks": {f"main;app:{route};db:query{rng.randrange(3)}": 1.0},
                "slowest": [
                    {"id": bucket, "duration": round(latency.max, 6), "instance": instance}
                ],
            }
            rows.append(
                {
                    "bucket": bucket,
                    "instance": instance,
                    "route": route,
                    "service": "shop",
                    "host": "h",
                    "count": 20,
                    "errors": rng.randrange(2),
                    "sketches": json.dumps({n: sketches[n].document() for n in SKETCHES}),
                    "slow": json.dumps(slow),
                }
            )
    return rows


@pytest.fixture(scope="module")
def filled_url(module_db_url):
    """A store holding the figures of STORED minutes (written once a module and engine)."""
    store = Store(module_db_url)
    store.migrate()
    store.close()
    rng = random.Random(7)
    engine = sa.create_engine(module_db_url)
    with engine.begin() as conn:
        for minute in STORED:
            add_request_rows(conn, minute_rows(T0 + 60 * minute, rng))
    engine.dispose()
    return module_db_url


@pytest.fixture(scope="module")
def client(filled_url):
    # No warming thread: a module's client outlives its first test (tests/conftest.py).
    app = create_app({"DATABASE_URL": filled_url, "WARM_HOURS": 0})
    try:
        yield app.test_client()
    finally:
        app.extensions["fleetflame_db"].close()


def routes(client, **query):
    answer = client.get("/api/requests", query_string=query)
    assert answer.status_code == 200, answer.data[:300]
    return answer.json


def fleet_rows(db_url, width):
    engine = sa.create_engine(db_url)
    table = schema.request_fleet
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table).where(table.c.width == width)).mappings().all()
    engine.dispose()
    return rows


@pytest.mark.parametrize(
    "start, end",
    [
        (T0 - 20 * 60, T0 + 3 * 3600 + 10 * 60),  # minutes, ten minutes and hours
        (T0 - 20 * 60 + 30, T0 + 3 * 3600 + 10 * 60 + 1),  # seconds into a minute
        (T0 + 600, T0 + 1800),  # ten minutes only
        (T0 - 1800, T0 + 4 * 3600),  # every minute stored
    ],
)
def test_merged_rows_answer_as_every_instances_minutes_do(client, start, end):
    window = {"from": start, "to": end}
    merged = routes(client, **window)
    by_minute = routes(client, **window, host="h")  # a host filter reads the minute rows
    assert [r["route"] for r in merged["routes"]] and merged["routes"] == by_minute["routes"]
    assert merged["slow_flamegraph"] == by_minute["slow_flamegraph"]
    minutes = sum(start <= T0 + 60 * minute < end for minute in STORED)
    counts = {r["route"]: r["count"] for r in merged["routes"]}
    assert counts == {route: minutes * 3 * 20 for route in ROUTES}  # 3 instances, 20 each


def test_every_width_holds_every_instance_merged(filled_url):
    for width, buckets in ((86400, 2), (3600, 5), (600, 3 * 6 + 6), (60, 240)):
        rows = fleet_rows(filled_url, width)
        assert len(rows) == buckets * len(ROUTES), width
        assert sum(row["count"] for row in rows) == 240 * 3 * 20 * len(ROUTES)


def test_a_window_too_long_in_minutes_is_answered_from_hours(client, monkeypatch):
    window = {"from": T0, "to": T0 + 3 * 3600}
    monkeypatch.setattr(worst, "MAX_REQUEST_ROWS", 100)  # 1,080 minute rows, 6 hour rows
    assert routes(client, **window)["routes"]
    refused = client.get("/api/requests", query_string={**window, "host": "h"})
    assert refused.status_code == 400
    assert "leave out the host and instance filters" in refused.json["error"]


def test_the_slowest_requests_diff_reads_hours_too(client):
    query = {"from": T0, "to": T0 + 3 * 3600, "route": "/search"}
    merged = client.get("/api/slow-diff", query_string=query)
    by_minute = client.get("/api/slow-diff", query_string={**query, "host": "h"})
    assert merged.status_code == by_minute.status_code == 200
    assert merged.json["total_b"] == by_minute.json["total_b"] > 0


def test_a_merged_row_keeps_its_heaviest_slow_stacks_and_the_rest_as_other(sqlite_url):
    store = Store(sqlite_url)
    store.migrate()
    rows = minute_rows(T0, random.Random(1))[:1]
    slow = json.loads(rows[0]["slow"])
    many = MAX_FLEET_STACKS + 10
    slow["stacks"] = {f"main;f{i}": 1.0 + (i < 5) for i in range(many)}
    rows[0]["slow"] = json.dumps(slow)
    later = dict(rows[0], bucket=T0 + 60)
    with store.engine.write_transaction() as conn:
        add_request_rows(conn, rows)
        add_request_rows(conn, [later])
        table = schema.request_fleet
        (text,) = conn.execute(sa.select(table.c.slow).where(table.c.width == 3600)).one()
    stacks = json.loads(text)["stacks"]
    assert len(stacks) == MAX_FLEET_STACKS
    assert all(stacks[f"main;f{i}"] == 4.0 for i in range(5))  # the heaviest, kept whole
    assert sum(stacks.values()) == pytest.approx(2 * (many + 5))  # nothing lost
    assert stacks[OTHER] > 0
    store.close()


def test_merged_rows_expire_once_all_their_minutes_have(db_url):
    store = Store(db_url)
    store.migrate()
    with store.engine.write_transaction() as conn:
        for minute in (0, 59, 60):
            add_request_rows(conn, minute_rows(T0 + 60 * minute, random.Random(minute)))
    job = WorstCases(store)
    try:
        job.apply_retention(T0 + 30 * 60)  # half the first hour gone: its row stays
        assert buckets_left(store) == {
            60: [T0 + 3540, T0 + 3600],
            600: [T0 + 3000, T0 + 3600],
            3600: [T0, T0 + 3600],
            86400: [T0],
        }
        job.apply_retention(T0 + 3600)
        assert buckets_left(store)[3600] == [T0 + 3600]
    finally:
        job.close()
        store.close()


def buckets_left(store):
    table = schema.request_fleet
    with store.engine.sa_engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.width, table.c.bucket).distinct()).all()
    left = {}
    for width, bucket in sorted(rows):
        left.setdefault(width, []).append(bucket)
    return left


def test_the_migration_fills_the_fleet_rows_from_the_minutes_kept(db_url):
    store = Store(db_url)
    store.migrate("0007")  # a database from before request_fleet
    rng = random.Random(3)
    rows = [row for minute in range(0, 150, 7) for row in minute_rows(T0 + 60 * minute, rng)]
    with store.engine.write_transaction() as conn:
        conn.execute(schema.request_buckets.insert(), rows)
    store.migrate()
    with store.engine.sa_engine.connect() as conn:
        table = schema.request_fleet
        hours = conn.execute(sa.select(table).where(table.c.width == 3600)).mappings().all()
    store.close()
    assert {(h["bucket"], h["route"]) for h in hours} == {
        (T0 + 3600 * hour, route) for hour in range(3) for route in ROUTES
    }
    for route in ROUTES:
        mine = [r for r in rows if r["route"] == route]
        theirs = [h for h in hours if h["route"] == route]
        assert sum(h["count"] for h in theirs) == sum(r["count"] for r in mine)
        assert sum(h["errors"] for h in theirs) == sum(r["errors"] for r in mine)
