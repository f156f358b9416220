"""Request figures by the hour (issue 16): a long window reads every instance's requests
already merged per hour, service and route, and answers as the minute rows do."""

import json
import random

import pytest
import sqlalchemy as sa
from webhelpers import T0

from collector.store import Store, schema
from collector.worst import MAX_HOUR_STACKS, OTHER, SKETCHES, WorstCases, add_request_rows
from sampler._sketch import Sketch
from webui import create_app, worst

ROUTES = ("/orders/<id>", "/search")
INSTANCES = ("i-1", "i-2", "i-3")


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


@pytest.fixture
def client(db_url):
    store = Store(db_url)
    store.migrate()
    store.close()
    rng = random.Random(7)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        for minute in range(-30, 3 * 60 + 30):  # 30 minutes either side of three hours
            add_request_rows(conn, minute_rows(T0 + 60 * minute, rng))
    engine.dispose()
    app = create_app({"DATABASE_URL": db_url})
    try:
        yield app.test_client()
    finally:
        app.extensions["fleetflame_db"].close()


def routes(client, **query):
    answer = client.get("/api/requests", query_string=query)
    assert answer.status_code == 200, answer.data[:300]
    return answer.json


def test_whole_hours_read_merged_answer_as_the_minutes_do(client, db_url):
    window = {"from": T0 - 20 * 60, "to": T0 + 3 * 3600 + 10 * 60}
    merged = routes(client, **window)
    by_minute = routes(client, **window, host="h")  # a host filter reads the minute rows
    assert [r["route"] for r in merged["routes"]] and merged["routes"] == by_minute["routes"]
    assert merged["slow_flamegraph"] == by_minute["slow_flamegraph"]
    counts = {r["route"]: r["count"] for r in merged["routes"]}
    assert counts == {route: 210 * 3 * 20 for route in ROUTES}  # 3.5 h of minutes, 3 instances
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        hours = conn.execute(sa.select(sa.func.count()).select_from(schema.request_hours)).scalar()
    engine.dispose()
    assert hours == 5 * len(ROUTES)  # the two partial hours and three whole ones


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


def test_an_hour_keeps_its_heaviest_slow_stacks_and_the_rest_as_other(sqlite_url):
    store = Store(sqlite_url)
    store.migrate()
    rows = minute_rows(T0, random.Random(1))[:1]
    slow = json.loads(rows[0]["slow"])
    many = MAX_HOUR_STACKS + 10
    slow["stacks"] = {f"main;f{i}": 1.0 + (i < 5) for i in range(many)}
    rows[0]["slow"] = json.dumps(slow)
    later = dict(rows[0], bucket=T0 + 60)
    with store.engine.write_transaction() as conn:
        add_request_rows(conn, rows)
        add_request_rows(conn, [later])
        (text,) = conn.execute(sa.select(schema.request_hours.c.slow)).one()
    stacks = json.loads(text)["stacks"]
    assert len(stacks) == MAX_HOUR_STACKS
    assert all(stacks[f"main;f{i}"] == 4.0 for i in range(5))  # the heaviest, kept whole
    assert sum(stacks.values()) == pytest.approx(2 * (many + 5))  # nothing lost
    assert stacks[OTHER] > 0
    store.close()


def test_hours_expire_once_all_their_minutes_have(db_url):
    store = Store(db_url)
    store.migrate()
    with store.engine.write_transaction() as conn:
        for minute in (0, 59, 60):
            add_request_rows(conn, minute_rows(T0 + 60 * minute, random.Random(minute)))
    job = WorstCases(store)
    try:
        job.apply_retention(T0 + 30 * 60)  # half the first hour gone: its row stays
        with store.engine.sa_engine.connect() as conn:
            left = conn.execute(sa.select(schema.request_hours.c.hour).distinct()).scalars()
            assert sorted(left) == [T0, T0 + 3600]
        job.apply_retention(T0 + 3600)
        with store.engine.sa_engine.connect() as conn:
            left = conn.execute(sa.select(schema.request_hours.c.hour).distinct()).scalars()
            assert sorted(left) == [T0 + 3600]
    finally:
        job.close()
        store.close()


def test_the_migration_fills_the_hours_from_the_minutes_kept(db_url):
    store = Store(db_url)
    store.migrate("0007")  # a database from before request_hours
    rng = random.Random(3)
    rows = [row for minute in range(0, 150, 7) for row in minute_rows(T0 + 60 * minute, rng)]
    with store.engine.write_transaction() as conn:
        conn.execute(schema.request_buckets.insert(), rows)
    store.migrate()
    with store.engine.sa_engine.connect() as conn:
        hours = conn.execute(sa.select(schema.request_hours)).mappings().all()
    store.close()
    assert {(h["hour"], h["route"]) for h in hours} == {
        (T0 + 3600 * hour, route) for hour in range(3) for route in ROUTES
    }
    for route in ROUTES:
        mine = [r for r in rows if r["route"] == route]
        theirs = [h for h in hours if h["route"] == route]
        assert sum(h["count"] for h in theirs) == sum(r["count"] for r in mine)
        assert sum(h["errors"] for h in theirs) == sum(r["errors"] for r in mine)
