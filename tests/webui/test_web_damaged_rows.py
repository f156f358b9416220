"""Damaged rows of the worst-cases tables (written by hand, or by an older collector): every
endpoint reading them leaves them out and counts them in ``unreadable_rows``, as
/api/requests always did, rather than answering a 500 HTML page."""

import json

import pytest
import sqlalchemy as sa
from webhelpers import T0, client_over, record_slow_requests, record_stalls

from collector.store import SampleRow, schema

ROUTE = "/orders"
SLOWEST = {"main;app:order;db:query": 9.0, "main;app:order;app:render": 1.0}


def _rows():
    labels = {"route": ROUTE}
    return [
        SampleRow(T0 + 60 * m, "cpu", "shop", "h", "i", labels, "main;app:order;app:render", 50)
        for m in range(3)
    ]


def _damaged_requests(url):
    record_slow_requests(url, ROUTE, SLOWEST, [T0, T0 + 60])
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        # The third minute damaged in both tables: the slow part is not the stored shape, or
        # holds a weight no count is (JSON's Infinity, as Python reads it).
        for table, extra in (
            (schema.request_fleet, {"width": 60}),
            (schema.request_buckets, {"instance": "i", "host": "h"}),
        ):
            conn.execute(
                table.insert(),
                [
                    {"bucket": T0 + 120, "route": ROUTE, "service": "shop", "count": 1,
                     "errors": 0, "sketches": "{}", "slow": '{"count": 1}', **extra},
                ],
            )  # fmt: skip
    engine.dispose()


@pytest.mark.parametrize("hosts", [{}, {"host": "h"}])
def test_slow_diff_leaves_out_a_damaged_request_row_as_requests_does(tmp_path, hosts):
    with client_over(tmp_path / "f.db", _rows(), _damaged_requests) as client:
        query = {"from": T0, "to": T0 + 180, "route": ROUTE, **hosts}
        requests = client.get("/api/requests", query_string=query)
        assert requests.status_code == 200 and requests.json["unreadable_rows"] == 1
        answer = client.get("/api/slow-diff", query_string=query)
        assert answer.status_code == 200, answer.data[:300]
        assert answer.json["unreadable_rows"] == 1
        # B: the two readable minutes' slow stacks (9 + 1, twice); A: the route's samples.
        assert answer.json["total_b"] == 20 and answer.json["total_a"] == 150


def test_an_infinite_slow_weight_is_left_out_not_a_500(tmp_path):
    def infinite(url):
        record_slow_requests(url, ROUTE, {"main;app:order;db:query": 1.0}, [T0])
        engine = sa.create_engine(url)
        slow = '{"count": 1, "stacks": {"main;app:order;x": Infinity}, "slowest": []}'
        with engine.begin() as conn:
            for table in (schema.request_fleet, schema.request_buckets):
                conn.execute(table.update().values(slow=slow))
        engine.dispose()

    with client_over(tmp_path / "f.db", _rows(), infinite) as client:
        query = {"from": T0, "to": T0 + 180, "route": ROUTE}
        for endpoint in ("/api/requests", "/api/slow-diff"):
            answer = client.get(endpoint, query_string=query)
            assert answer.status_code == 200, (endpoint, answer.data[:300])


def _damaged_stalls(url):
    record_stalls(url, [(T0 + 60, 0.1), (T0 + 70, 0.2), (T0 + 80, 0.3), (T0 + 90, 0.4)])
    engine = sa.create_engine(url)
    table = schema.stall_events
    damaged = {
        2: "not json",
        3: json.dumps({"wall": ["main;x"], "cpu": {}}),
        4: json.dumps({"wall": {"main;x": float("inf")}, "cpu": {}}),
    }
    with engine.begin() as conn:
        for row_id, stacks in damaged.items():
            conn.execute(table.update().where(table.c.id == row_id).values(stacks=stacks))
    engine.dispose()


def test_stalls_keep_a_damaged_row_without_its_stacks(tmp_path):
    with client_over(tmp_path / "f.db", _rows(), _damaged_stalls) as client:
        answer = client.get("/api/stalls", query_string={"from": T0, "to": T0 + 180})
        assert answer.status_code == 200, answer.data[:300]
        data = answer.json
        assert data["count"] == 4 and data["unreadable_rows"] == 3
        by_duration = {stall["duration"]: stall for stall in data["stalls"]}
        assert not by_duration[0.1]["unreadable"]
        assert by_duration[0.1]["stacks"]["wall"] == {"main;app:handle;time:sleep": 1.0}
        for duration in (0.2, 0.3, 0.4):
            stall = by_duration[duration]
            assert stall["unreadable"] and stall["stacks"] == {"wall": {}, "cpu": {}}
        # The flamegraph of stall time: the one readable stall's stacks.
        assert data["flamegraph"]["total"] == 1
