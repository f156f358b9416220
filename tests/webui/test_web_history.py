"""/api/function-series: a function's share per step, the deploy that changed it, and the
change point found in it (issue 15, when did it start)."""

import random
from datetime import datetime, timezone

import pytest
from webhelpers import client_over, record_finding

from collector.store import SampleRow
from sampler.profile import escape_frame

T0 = 1_700_000_000 // 86400 * 86400
DEPLOY = T0 + 70 * 60  # version 1.4.2 from minute 70: render's share jumps from ~10% to ~25%


def rows(seed=11):
    rng = random.Random(seed)
    out = []
    for minute in range(120):
        bucket = T0 + 60 * minute
        version = "1.4.2" if bucket >= DEPLOY else "1.4.1"
        render = rng.randint(80, 120) if version == "1.4.1" else rng.randint(280, 320)
        for stack, count in (
            ("__main__:<module>;app:serve;app:render", render),
            ("__main__:<module>;app:serve;json:dumps", rng.randint(850, 950)),
        ):
            labels = {"version": version}
            out.append(SampleRow(bucket, "cpu", "api", "web-1", "i-1", labels, stack, count, 0.01))
    return out


def findings(url):
    # The scheduled comparison's finding 5 minutes after the deploy; one of another function.
    record_finding(url, "app:render", DEPLOY, DEPLOY + 300)
    record_finding(url, "json:dumps", DEPLOY, DEPLOY + 300)


@pytest.fixture
def client(tmp_path):
    with client_over(tmp_path / "fleetflame.db", rows(), findings) as client:
        yield client


def test_the_series_shows_the_step_its_deploy_and_its_change_point(client):
    answer = client.get(
        "/api/function-series",
        query_string={"function": "app:render", "from": T0, "to": T0 + 7200, "service": "api"},
    )
    assert answer.status_code == 200, answer.data[:300]
    data = answer.json
    assert data["bucket_seconds"] == 120 and len(data["points"]) == 60
    before = [p["share"] for p in data["points"][:30]]
    after = [p["share"] for p in data["points"][40:]]
    assert 0.08 < sum(before) / 30 < 0.12 and 0.2 < sum(after) / 20 < 0.3
    deploy = datetime.fromtimestamp(DEPLOY, timezone.utc).isoformat()
    assert data["deploys"] == [
        {"t": deploy, "label": "version", "before": "1.4.1", "after": "1.4.2"}
    ]
    (point,) = data["change_points"]
    assert point["t"] == deploy
    (finding,) = data["findings"]  # its own, not json:dumps's
    assert finding["b_from"] == deploy and finding["change"] == 3.0
    assert finding["compared"] == "version 1.4.1 -> 1.4.2"
    before = client.get(
        "/api/function-series",
        query_string={"function": "app:render", "from": T0, "to": DEPLOY, "service": "api"},
    ).json
    assert before["findings"] == []  # its B window starts where this window ends
    assert point["shift"] == pytest.approx(0.25 - 0.1, abs=0.03) and point["p"] < 1e-6
    total = client.get(
        "/api/function-series",
        query_string={"function": "app:serve", "kind": "total", "from": T0, "to": T0 + 7200},
    ).json
    assert all(p["share"] == 1.0 for p in total["points"]) and total["change_points"] == []


@pytest.mark.parametrize(
    "query", [{}, {"function": "app:render", "kind": "both"}, {"function": "x" * 70_000}]
)
def test_bad_parameters_are_400(client, query):
    answer = client.get("/api/function-series", query_string={"from": T0, "to": T0 + 600, **query})
    assert answer.status_code == 400 and "param" in answer.json


def test_the_sandwich_merges_callers_and_callees_across_the_graph(client):
    # app:render is called from app:serve only; it calls nothing: its callers' tree is
    # render <- serve <- <module>, its callees' tree is render alone, with all its samples.
    data = client.get(
        "/api/sandwich",
        query_string={"function": "app:render", "from": T0, "to": T0 + 7200},
    ).json
    assert data["samples"] == data["self"] > 0
    assert data["callers"]["name"] == "app:render" and data["callers"]["value"] == data["samples"]
    (serve,) = data["callers"]["children"]
    assert serve["name"] == "app:serve" and serve["children"][0]["name"] == "__main__:<module>"
    assert data["callees"]["name"] == "app:render" and not data["callees"].get("children")
    whole = client.get(
        "/api/sandwich", query_string={"function": "app:serve", "from": T0, "to": T0 + 7200}
    ).json
    assert {c["name"] for c in whole["callees"]["children"]} == {"app:render", "json:dumps"}
    assert whole["self"] == 0 and whole["share"] == 1.0
    missing = client.get(
        "/api/sandwich", query_string={"function": "no:such", "from": T0, "to": T0 + 7200}
    ).json
    assert missing["samples"] == 0 and missing["callers"] is None


def test_time_order_puts_a_frame_per_step_oldest_first(client):
    answer = client.get("/api/time-order", query_string={"from": T0, "to": T0 + 7200})
    assert answer.status_code == 200, answer.data[:300]
    data = answer.json
    steps = data["tree"]["children"]
    assert data["step"] == 120 and len(steps) == 60  # two hours in at most 60 columns
    assert [s["t"] for s in steps] == [T0 + 120 * i for i in range(60)]
    assert steps[0]["name"] == datetime.fromtimestamp(T0, timezone.utc).isoformat()

    # Each column holds its own minutes only: render's share jumps at the deploy's column.
    def render_share(step):
        (serve,) = step["children"][0]["children"]  # __main__:<module> -> app:serve
        render = [c for c in serve["children"] if c["name"] == "app:render"]
        return render[0]["value"] / step["value"]

    deploy_column = (DEPLOY - T0) // 120
    assert render_share(steps[deploy_column - 1]) < 0.15 < 0.2 < render_share(steps[deploy_column])
    assert data["total"] == sum(s["value"] for s in steps) and data["interval"] == 0.01


@pytest.mark.parametrize("name", ["mod:  padded  ", " ", "mod:" + "L" * 10_000])
def test_a_name_the_flamegraph_draws_is_found_exactly(tmp_path, name):
    # Spaces at a name's ends are part of it (they were stripped: 0 samples where the graph
    # drew 1,620), and a frame of 10,000 characters is a frame like any (it was a 400).
    stack = f"__main__:<module>;{escape_frame(name)}"
    rows = [SampleRow(T0 + 60 * m, "cpu", "api", "h", "i", {}, stack, 54) for m in range(30)] + [
        SampleRow(T0, "cpu", "api", "h", "i", {}, "__main__:<module>;mod:padded", 7)
    ]
    window = {"from": T0, "to": T0 + 1800, "function": name}
    with client_over(tmp_path / "f.db", rows) as client:
        series = client.get("/api/function-series", query_string=window)
        assert series.status_code == 200, series.data[:300]
        assert series.json["function"] == name
        assert sum(p["samples"] for p in series.json["points"]) == 1620
        sandwich = client.get("/api/sandwich", query_string=window)
        assert sandwich.status_code == 200, sandwich.data[:300]
        assert sandwich.json["samples"] == sandwich.json["self"] == 1620
        assert sandwich.json["callers"]["name"] == name
