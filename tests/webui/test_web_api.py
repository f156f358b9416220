"""The JSON API on SQLite and PostgreSQL, over data written by the collector's store."""

from __future__ import annotations

import gzip
import json

import pytest
from test_web_exports import decode_pprof
from webhelpers import T0, XSS, expected, fleet_rows

from collector.store import SampleRow, Store
from sampler.profile import parse_folded

HOUR = f"from={T0}&to={T0 + 3600}"


def walk(node, path=()):
    yield path + (node["name"],), node
    for child in node["children"]:
        yield from walk(child, path + (node["name"],))


def test_flamegraph_totals_and_tree(client):
    body = client.get(f"/api/flamegraph?{HOUR}").get_json()
    assert body["total"] == sum(expected().values())
    assert body["selection"]["from"] == T0 and body["selection"]["to"] == T0 + 3600
    assert body["resolution"] == 60
    names = {path[-1]: node for path, node in walk(body["tree"])}
    assert (
        names["json:dumps"]["value"]
        == expected()["__main__:<module>;app:serve;app:handle;json:dumps"]
    )
    assert XSS in names and "m:semi;colon" in names  # unescaped for display, markup untouched
    assert body["pruned_nodes"] == 0


def test_filters_by_service_host_and_label(client):
    api = client.get(f"/api/flamegraph?{HOUR}&service=api").get_json()
    assert api["total"] == sum(expected(service="api").values())
    one = client.get(f"/api/flamegraph?{HOUR}&service=api&host=web-2").get_json()
    assert one["total"] == sum(expected(host="web-2").values())
    label = client.get(f"/api/flamegraph?{HOUR}&label=version:1.4.2").get_json()
    assert label["total"] == sum(expected(version="1.4.2").values())
    both = client.get(f"/api/folded?{HOUR}&label=version:1.4.1&label=version:1.4.2&service=worker")
    assert parse_folded(both.get_data(as_text=True)) == expected(service="worker")
    quoted = client.get(f'/api/flamegraph?{HOUR}&label=route:/up"load').get_json()
    assert quoted["total"] == sum(expected().values())
    none = client.get(f"/api/flamegraph?{HOUR}&service=nope").get_json()
    assert none["total"] == 0 and none["tree"]["children"] == []


def test_sub_window(client):
    body = client.get(f"/api/flamegraph?from={T0 + 600}&to={T0 + 1200}").get_json()
    assert body["total"] == sum(expected(minutes=10).values())


def test_max_nodes_bounds_what_is_sent(client):
    body = client.get(f"/api/flamegraph?{HOUR}&max_nodes=5").get_json()
    nodes = list(walk(body["tree"]))
    assert len(nodes) == body["nodes"] <= 5
    assert body["pruned_nodes"] >= 1 and body["tree"]["value"] == sum(expected().values())
    assert any(node["name"] == "[pruned]" for _, node in nodes)


def test_exports(client):
    folded = client.get(f"/api/folded?{HOUR}")
    assert folded.content_type.startswith("text/plain")
    assert parse_folded(folded.get_data(as_text=True)) == expected()
    speedscope = client.get(f"/api/speedscope?{HOUR}&service=worker")
    assert "attachment" in speedscope.headers["Content-Disposition"]
    doc = json.loads(speedscope.data)
    assert doc["profiles"][0]["weights"] == [5 * 60 * 0.01]  # seconds at 100 Hz
    pprof = client.get(f"/api/export?format=pprof&{HOUR}")
    assert pprof.headers["Content-Disposition"].endswith('.pb.gz"')
    decoded = decode_pprof(pprof.data)
    assert sum(decoded["stacks"].values()) == sum(expected().values())
    assert gzip.decompress(pprof.data)  # gzipped
    exported = client.get(f"/api/export?{HOUR}")
    assert exported.get_data(as_text=True) == folded.get_data(as_text=True)
    # The page's export link is a download; /api/folded stays inline for curl | flamegraph.pl.
    assert exported.headers["Content-Disposition"].endswith('.folded"')
    assert "Content-Disposition" not in folded.headers


def test_diff_of_two_label_values(client):
    body = client.get(
        f"/api/diff?{HOUR}&service=api&a_label=version:1.4.1&b_label=version:1.4.2"
    ).get_json()
    assert body["total_a"] == 600 and body["total_b"] == 660
    names = {path[-1]: node for path, node in walk(body["tree"])}
    render = names["app:render"]
    assert render["a"] == pytest.approx(3 / 10) and render["b"] == pytest.approx(8 / 11)
    assert render["delta"] == pytest.approx(8 / 11 - 3 / 10)
    assert names[XSS]["b"] == 0 and names[XSS]["a"] == pytest.approx(0.1)
    top = body["functions"][0]
    assert top["name"] in ("app:render", "json:dumps")
    assert abs(top["self_delta"]) == max(abs(f["self_delta"]) for f in body["functions"])
    assert body["a"]["label"] == ["version:1.4.1"] and body["b"]["service"] == ["api"]


def test_diff_of_two_windows(client):
    body = client.get(
        f"/api/diff?a_from={T0}&a_to={T0 + 600}&b_from={T0 + 600}&b_to={T0 + 3600}&order=total"
    ).get_json()
    assert body["total_a"] == sum(expected(minutes=10).values())
    assert body["total_b"] == sum(expected(minutes=50).values())
    # Same fleet in both windows: every share is unchanged.
    assert all(abs(node["delta"]) < 1e-9 for _, node in walk(body["tree"]))


def test_timeline(client):
    body = client.get(f"/api/timeline?{HOUR}").get_json()
    assert body["step"] == 60 and len(body["points"]) == 60
    per_minute = sum(expected(minutes=1).values())
    assert all(count == per_minute for _, count in body["points"])
    assert body["total"] == sum(expected().values())
    coarse = client.get(f"/api/timeline?{HOUR}&step=600&service=worker").get_json()
    assert coarse["points"] == [[T0 + 600 * i, 5 * 10] for i in range(6)]
    # A window wider than the data: zero-filled, chosen step.
    day = client.get(f"/api/timeline?from={T0 - 86400}&to={T0 + 86400}").get_json()
    assert day["step"] == 600 and len(day["points"]) == 288
    assert day["total"] == sum(expected().values())
    # A window cut inside a minute reads the minutes that start in it: its points too (the
    # minute it cuts was a zero at the chart's left edge, a dip that was never there).
    cut = client.get(f"/api/timeline?from={T0 + 30}&to={T0 + 3600}").get_json()
    assert cut["points"][0] == [T0 + 60, per_minute] and len(cut["points"]) == 59
    assert cut["selection"]["read_from"] == T0 + 60


def test_top_functions(client):
    body = client.get(f"/api/top?{HOUR}&limit=3").get_json()
    assert len(body["functions"]) == 3
    first = body["functions"][0]
    assert first["name"] == "app:render" and first["self"] == 11 * 60
    assert first["self_share"] == pytest.approx(first["self"] / body["total"])
    assert all(f["total"] >= f["self"] for f in body["functions"])


def test_top_functions_matching_a_search(client):
    full = client.get(f"/api/top?{HOUR}&limit=100").get_json()["functions"]
    found = client.get(f"/api/top?{HOUR}&limit=1&search=app:|main").get_json()["functions"]
    expected = [f for f in full if "app:" in f["name"] or "main" in f["name"]]
    assert len(expected) >= 2 and found == expected[:1]
    everything = client.get(f"/api/top?{HOUR}&limit=100&search=app:|main").get_json()
    assert everything["functions"] == expected  # callers with no self samples too
    assert any(f["self"] == 0 for f in expected)
    # Plain text: a pattern made to backtrack is only characters to look for.
    assert client.get(f"/api/top?{HOUR}&search=(.*a)*b").get_json()["functions"] == []


def test_labels_offer_every_value(client):
    values = client.get(f"/api/labels?{HOUR}").get_json()["values"]
    assert values["service"] == ["api", "worker"]
    assert values["host"] == ["job-1", "web-1", "web-2"]
    assert values["version"] == ["1.4.1", "1.4.2"]
    assert values["route"] == ['/up"load']
    worker = client.get(f"/api/labels?{HOUR}&service=worker").get_json()["values"]
    assert worker["host"] == ["job-1"] and worker["service"] == ["api", "worker"]


def test_large_window_reads_the_rollups(db_url):
    from webui import create_app

    store = Store(db_url)
    store.migrate()
    store.write(fleet_rows())
    store.rollup(T0 + 10 * 86400)  # old enough for the hourly tier
    store.close()
    app = create_app({"DATABASE_URL": db_url})
    client = app.test_client()
    body = client.get(f"/api/flamegraph?from={T0 - 20 * 86400}&to={T0 + 10 * 86400}").get_json()
    assert body["total"] == sum(expected().values())
    assert body["resolution"] >= 600
    timeline = client.get(f"/api/timeline?from={T0 - 20 * 86400}&to={T0 + 10 * 86400}").get_json()
    assert timeline["total"] == sum(expected().values())
    app.extensions["fleetflame_db"].close()


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("from=yesterday", "from"),
        ("to=2026-13-45", "to"),
        (f"from={T0 + 10}&to={T0}", "from"),
        (f"{HOUR}&mode=gpu", "mode"),
        (f"{HOUR}&label=version", "label"),
        (f"{HOUR}&max_nodes=1", "max_nodes"),
        (f"{HOUR}&max_nodes=lots", "max_nodes"),
        (f"{HOUR}&min_share=2", "min_share"),
        (f"{HOUR}&min_share=nan", "min_share"),
        (f"{HOUR}&service=a%00b", "service"),  # (a newline is a name like any)
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(client, query, param):
    response = client.get(f"/api/flamegraph?{query}")
    assert response.status_code == 400
    body = response.get_json()
    assert body["param"] == param and body["error"].startswith(param)


@pytest.mark.parametrize(
    ("path", "param"),
    [
        (f"/api/diff?{HOUR}&b_from=soon", "b_from"),
        (f"/api/diff?{HOUR}&a_from={T0 + 3600}&a_to={T0}", "a_from"),
        (f"/api/diff?{HOUR}&order=name", "order"),
        (f"/api/diff?{HOUR}&limit=0", "limit"),
        (f"/api/timeline?{HOUR}&step=1", "step"),
        ("/api/timeline?from=-30d&step=60", "step"),
        (f"/api/top?{HOUR}&limit=-1", "limit"),
        (f"/api/top?{HOUR}&search={'x' * 201}", "search"),
        (f"/api/export?{HOUR}&format=svg", "format"),
        ("/api/labels?from=x", "from"),
    ],
)
def test_bad_parameters_on_every_endpoint(client, path, param):
    response = client.get(path)
    assert response.status_code == 400, response.data
    assert response.get_json()["param"] == param


def test_unknown_api_path_is_json_404(client):
    response = client.get("/api/nothing")
    assert response.status_code == 404 and "error" in response.get_json()


def test_the_ui_never_writes(db_url):
    from webui import create_app
    from webui.db import get_db

    store = Store(db_url)
    store.migrate()
    store.write(fleet_rows(minutes=1))
    store.close()
    app = create_app({"DATABASE_URL": db_url})
    with app.app_context():
        engine = get_db().query.store.engine
        with pytest.raises(Exception, match="(?i)read.?only"):
            with engine.read_transaction() as conn:
                conn.exec_driver_sql("DELETE FROM samples")
        assert get_db().query.profile(T0, T0 + 60) == expected(minutes=1)
    store = Store(db_url)
    store.write(fleet_rows(minutes=1, start=T0 + 3600))  # the collector still can
    store.close()
    app.extensions["fleetflame_db"].close()


def test_the_sampling_interval_carries_through_every_unit(db_url):
    """A worker sampled at 50 Hz: counts stay counts, every time is counted at 20 ms."""
    from webui import create_app

    store = Store(db_url)
    store.migrate()
    slow = [
        SampleRow(r.bucket, r.mode, r.service, r.host, r.instance, r.labels, r.stack, r.count, 0.02)
        for r in fleet_rows()
        if r.host == "job-1"
    ]
    store.write(slow)
    store.close()
    app = create_app({"DATABASE_URL": db_url})
    client = app.test_client()
    samples = 5 * 60  # jobs:resize, 5 a minute for an hour
    graph = client.get(f"/api/flamegraph?{HOUR}").get_json()
    assert graph["total"] == samples and graph["interval"] == 0.02
    assert graph["seconds"] == pytest.approx(samples * 0.02)
    top = client.get(f"/api/top?{HOUR}").get_json()["functions"][0]
    assert top["self"] == samples and top["self_seconds"] == pytest.approx(samples * 0.02)
    folded = client.get(f"/api/folded?{HOUR}").get_data(as_text=True)
    assert parse_folded(folded) == expected(service="worker")  # counts, not seconds
    pprof = decode_pprof(client.get(f"/api/pprof?{HOUR}").data)
    assert pprof["period"] == 20_000_000
    assert pprof["values"] == [[samples, samples * 20_000_000]]
    speedscope = json.loads(client.get(f"/api/speedscope?{HOUR}").data)["profiles"][0]
    assert speedscope["weights"] == [pytest.approx(samples * 0.02)]
    app.extensions["fleetflame_db"].close()


def test_a_window_mixing_intervals_counts_at_the_finest(db_url):
    from webui import create_app

    store = Store(db_url)
    store.migrate()
    rows = [r for r in fleet_rows(minutes=1) if r.host == "job-1"]
    store.write(rows)  # 100 Hz: 5 samples of jobs:resize
    fast = rows[0]
    store.write([SampleRow(T0, "cpu", "worker", "job-2", "j2", fast.labels, fast.stack, 4, 0.05)])
    store.close()
    app = create_app({"DATABASE_URL": db_url})
    client = app.test_client()
    window = f"from={T0}&to={T0 + 60}"
    graph = client.get(f"/api/flamegraph?{window}").get_json()
    # 4 samples of 50 ms are 20 of 10 ms.
    assert graph["interval"] == 0.01 and graph["total"] == 5 + 20
    diff = client.get(f"/api/diff?{window}&a_host=job-1&b_host=job-2").get_json()
    assert (diff["total_a"], diff["total_b"], diff["interval"]) == (5, 20, 0.01)
    timeline = client.get(f"/api/timeline?{window}").get_json()
    assert timeline["total"] == 25
    app.extensions["fleetflame_db"].close()


def test_intervals_of_other_windows_and_of_each_side_count_as_they_should(db_url):
    from webui import create_app

    store = Store(db_url)
    store.migrate()
    rows = [r for r in fleet_rows(minutes=2) if r.host == "job-1"]
    store.write(rows)  # 100 Hz: 5 samples of jobs:resize a minute
    stack, labels = rows[0].stack, rows[0].labels
    # A 200 Hz worker two days before: none of its samples is in the windows below, and it
    # made them count in 5 ms samples (every count doubled).
    store.write([SampleRow(T0 - 2 * 86400, "cpu", "worker", "old", "o1", labels, stack, 9, 0.005)])
    # A 50 Hz worker in the second minute: 4 samples are 8 of 10 ms.
    store.write([SampleRow(T0 + 60, "cpu", "worker", "job-2", "j2", labels, stack, 4, 0.02)])
    store.close()
    app = create_app({"DATABASE_URL": db_url})
    client = app.test_client()
    first = f"from={T0}&to={T0 + 60}"
    graph = client.get(f"/api/flamegraph?{first}").get_json()
    assert (graph["total"], graph["interval"]) == (5, 0.01)
    assert client.get(f"/api/timeline?{first}").get_json()["total"] == 5
    # Split by host, each line counted in the whole timeline's samples: they add up to it.
    both = f"from={T0}&to={T0 + 120}"
    timeline = client.get(f"/api/timeline?{both}&split=host").get_json()
    lines = {line["value"]: line["total"] for line in timeline["series"]}
    assert lines == {"job-1": 10, "job-2": 8} and timeline["total"] == 18
    # The significance test's replicates count as the diff does: 20 ms samples twice.
    second = f"a_from={T0}&a_to={T0 + 60}&b_from={T0 + 60}&b_to={T0 + 120}"
    diff = client.get(f"/api/diff?{second}").get_json()
    assert (diff["total_a"], diff["total_b"]) == (5, 13)
    app.extensions["fleetflame_db"].close()
    from collector.compare_db import replicates_in
    from collector.query import Filters, Query

    with Store(db_url) as store:
        replicates, _ = replicates_in(Query(store), Filters(), T0 + 60, T0 + 120)
    assert sorted(sum(counts.values()) for counts in replicates) == [5, 8]


def test_history_views_read_the_buckets_that_start_in_the_window(client):
    # `from` 30 s into a minute: that minute is not read, by the flamegraph or by these.
    window = f"from={T0 + 630}&to={T0 + 1200}"
    total = client.get(f"/api/flamegraph?{window}").get_json()["total"]
    assert total == sum(expected(minutes=20).values()) - sum(expected(minutes=11).values())
    order = client.get(f"/api/time-order?{window}").get_json()
    assert order["tree"]["value"] == total
    series = client.get(f"/api/function-series?{window}&function=json:dumps").get_json()
    assert sum(point["total"] for point in series["points"]) == total
    # A window of 121 minutes reads in steps of two: the last step stops at `to`.
    long = client.get(f"/api/function-series?from={T0 - 3600}&to={T0 + 1260}&function=json:dumps")
    assert sum(p["total"] for p in long.get_json()["points"]) == sum(expected(minutes=21).values())


def test_the_timeline_split_by_a_label_has_a_line_per_value(client):
    body = client.get(f"/api/timeline?{HOUR}&split=version").get_json()
    values = {s["value"]: s for s in body["series"]}
    assert set(values) == {"1.4.1", "1.4.2"}
    assert sum(s["total"] for s in body["series"]) == body["total"]
    for series in body["series"]:
        assert len(series["points"]) == len(body["points"])
    hosts = client.get(f"/api/timeline?{HOUR}&split=host").get_json()["series"]
    assert {s["value"] for s in hosts} == {"web-1", "web-2", "job-1"}
    assert client.get(f"/api/timeline?{HOUR}&split={'k' * 300}").status_code == 400


def test_a_split_by_a_filtered_key_keeps_to_the_filter(client):
    # A line per value the filter accepts, adding up to the total the page shows: a value it
    # does not accept drew a line over the chart's scale.
    for split, query in (("version", "label=version:1.4.1"), ("host", "host=web-2")):
        body = client.get(f"/api/timeline?{HOUR}&{query}&split={split}").get_json()
        assert [s["value"] for s in body["series"]] == [query.rpartition(":")[2].split("=")[-1]]
        assert body["series"][0]["total"] == body["total"] > 0
    both = "label=version:1.4.1&label=version:1.4.2"
    body = client.get(f"/api/timeline?{HOUR}&{both}&split=version").get_json()
    assert {s["value"] for s in body["series"]} == {"1.4.1", "1.4.2"}
    assert sum(s["total"] for s in body["series"]) == body["total"]
