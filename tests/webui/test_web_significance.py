"""/api/significance: the compare view's statistics, on a synthetic fleet whose truth is known
(issue 15, compare with confidence)."""

import random

import pytest
from webhelpers import client_over

from collector.store import SampleRow

T0 = 1_700_000_000 // 86400 * 86400
MINUTES = 30  # a side: 6 instances x 30 minutes
DEPLOY = T0 + MINUTES * 60
# render's self share: 10% before the deploy, 13% after; a hostile name (";" and "%" escaped in
# folded text) is unchanged at 20%, the rest is json:dumps.
RENDER = {"1.4.1": 0.10, "1.4.2": 0.13}
HOSTILE = "app:parse;50%"


def rows(seed=5):
    rng = random.Random(seed)
    out = []
    for instance in range(6):
        for minute in range(2 * MINUTES):
            bucket = T0 + 60 * minute
            version = "1.4.2" if bucket >= DEPLOY else "1.4.1"
            # Overdispersed: each instance-minute's shares move by more than sample counting.
            render = RENDER[version] + rng.gauss(0, 0.01)
            parse = 0.20 + rng.gauss(0, 0.01)
            total = 1000
            labels = {"version": version}
            for stack, count in (
                ("main;app:render", round(render * total)),
                ("main;app:parse%3B50%25", round(parse * total)),
                ("main;json:dumps", round((1 - render - parse) * total)),
            ):
                out.append(
                    SampleRow(
                        bucket,
                        "cpu",
                        "api",
                        f"web-{instance}",
                        f"i-{instance}",
                        labels,
                        stack,
                        count,
                        0.01,
                    )
                )
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tmp_path_factory.mktemp("significance") / "fleetflame.db"
    with client_over(path, rows()) as client:
        yield client


def significance(client, **sides):
    answer = client.get("/api/significance", query_string={"service": "api", **sides})
    assert answer.status_code == 200, answer.data[:300]
    return answer.json


def by_function(data, kind="self"):
    return {f["function"]: f for f in data["findings"] if f["kind"] == kind}


def test_a_real_change_between_versions_is_significant_with_its_interval(client):
    data = significance(
        client,
        **{"from": T0, "to": T0 + 2 * MINUTES * 60},
        a_label="version:1.4.1",
        b_label="version:1.4.2",
    )
    # An hour of 6 instances in at most 120 replicates a side: 3-minute steps, half of them
    # holding each version.
    assert data["judged"] and data["replicates"] == {"a": 60, "b": 60}
    found = by_function(data)
    render = found["app:render"]
    assert render["significant"] and render["q"] < 0.001
    assert render["change"] == pytest.approx(3.0, abs=0.3)  # points
    assert render["ci_low"] < 3.0 < render["ci_high"] and render["ci_low"] > 1.5
    # The hostile name comes back as the flamegraph names it; unchanged, not significant.
    assert (
        not found[HOSTILE]["significant"]
        and found[HOSTILE]["ci_low"] < 0 < found[HOSTILE]["ci_high"]
    )
    # Every frame's total share moves with its self share here but main's (always 100%).
    assert "main" not in {f["function"] for f in data["findings"] if f["significant"]}
    floor = data["noise_floor"]
    assert 0 < floor["mde"] < 1.5 and floor["splits"] == 20


def test_two_halves_of_one_version_show_no_significant_change(client):
    half = T0 + MINUTES * 30
    data = significance(
        client, a_from=T0, a_to=half, b_from=half, b_to=DEPLOY, a_label="", b_label=""
    )
    assert data["judged"] and data["replicates"] == {"a": 90, "b": 90}
    assert not [f for f in data["findings"] if f["significant"]]


def test_a_side_without_replicates_is_not_judged_and_says_why(client):
    data = significance(client, **{"from": T0, "to": DEPLOY}, b_label="version:9.9")
    assert data["judged"] is False and data["replicates"]["b"] == 0
    assert "side B has 0 profile" in data["reason"]


def test_a_bad_side_is_400(client):
    answer = client.get("/api/significance", query_string={"a_from": "yesterday-ish"})
    assert answer.status_code == 400 and answer.json["param"] == "a_from"
