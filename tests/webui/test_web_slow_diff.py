"""/api/slow-diff: a route's slowest 1% of requests against all of its samples (issue 16)."""

import pytest
from webhelpers import T0, client_over, record_slow_requests

from collector.store import SampleRow

ROUTE = "/orders/<id>"
# Every sample of the route: 80% rendering, 20% the database; its slowest requests' stacks:
# mostly the database (a lock held).
ALL = {"main;app:order;app:render": 800, "main;app:order;db:query": 200}
SLOWEST = {"main;app:order;db:query": 9.5, "main;app:order;app:render": 0.5}


def slow_rows(url):
    record_slow_requests(url, ROUTE, SLOWEST, [T0, T0 + 60])
    record_slow_requests(url, "/other", {"main;other": 50.0}, [T0, T0 + 60])


def rows():
    labels = {"route": ROUTE}
    return [
        SampleRow(T0 + 60 * minute, "cpu", "shop", "h", "i", labels, stack, count // 2)
        for minute in range(2)
        for stack, count in ALL.items()
    ] + [SampleRow(T0, "cpu", "shop", "h", "i", {"route": "/other"}, "main;other", 500)]


def test_the_slowest_requests_of_a_route_against_all_of_it(tmp_path):
    with client_over(tmp_path / "f.db", rows(), slow_rows) as client:
        query = {"from": T0, "to": T0 + 120, "route": ROUTE}
        answer = client.get("/api/slow-diff", query_string=query)
        assert answer.status_code == 200, answer.data[:300]
        data = answer.json
        # A: the route's own samples only (not /other's); B: its slow stacks, whole samples.
        assert data["total_a"] == 1000 and data["total_b"] == 20
        changes = {f["name"]: f for f in data["functions"]}
        assert changes["db:query"]["self_delta"] == pytest.approx(0.95 - 0.2)
        assert changes["app:render"]["self_delta"] < 0
        assert data["tree"]["children"][0]["name"] == "main"
        missing = client.get("/api/slow-diff", query_string={**query, "route": "/nope"}).json
        assert missing["total_a"] == 0 and missing["total_b"] == 0
        assert client.get("/api/slow-diff", query_string={"from": T0}).status_code == 400
