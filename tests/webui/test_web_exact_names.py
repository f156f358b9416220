"""Every service, host, instance and label the store can hold is a filter that finds its
samples: the values /api/labels offers and the split timeline's lines, asked for as they are
(spaces at their ends, a tab, a value of 1,024 characters, a key holding ':'), where they
were stripped, refused as control characters or longer than 1,000, or split at the key's ':'."""

from __future__ import annotations

import pytest
from webhelpers import T0, client_over

from collector.store import SampleRow
from webui.params import label_param

STACK = "__main__:<module>;app:work"
# (service, host, instance, labels): each series its own count per minute, so a filter that
# finds another series' samples, or several, is told from one that finds its own.
SERIES = [
    ("api", "web-1", "i-1", {"version": "1.0", "route": "/plain"}, 1),
    ("space svc ", " host ", " inst ", {"version": " 2.0 ", "tabbed": "a\tb"}, 2),
    ("tab\tsvc", "h\tb", "i-3", {"long": "V" * 1024, "k:colon": "v:colon", " k ": "x"}, 4),
    ("api", "web-1", "i-4", {"version": "", '"q"': "new\nline"}, 8),
]
MINUTES = 3


def rows() -> list[SampleRow]:
    return [
        SampleRow(T0 + 60 * m, "cpu", svc, host, inst, labels, STACK, count)
        for m in range(MINUTES)
        for svc, host, inst, labels, count in SERIES
    ]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with client_over(tmp_path_factory.mktemp("names") / "f.db", rows()) as client:
        yield client


WINDOW = {"from": T0, "to": T0 + 60 * MINUTES}


def expected(key: str, value: str) -> int:
    """The samples of the series whose ``key`` (a column or a label) is ``value``."""
    columns = ("service", "host", "instance")
    found = 0
    for svc, host, inst, labels, count in SERIES:
        have = dict(zip(columns, (svc, host, inst), strict=True)).get(key, labels.get(key))
        found += count * MINUTES if have == value else 0
    return found


def test_every_value_offered_is_a_filter_that_finds_its_samples(client):
    offered = client.get("/api/labels", query_string=WINDOW).json["values"]
    assert " host " in offered["host"] and " 2.0 " in offered["version"]
    assert offered["long"] == ["V" * 1024] and offered["k:colon"] == ["v:colon"]
    tried = 0
    for key, values in offered.items():
        for value in values:
            if key in ("service", "host", "instance"):
                query = {**WINDOW, key: value}
            else:
                query = {**WINDOW, "label": label_param(key, value)}
            answer = client.get("/api/flamegraph", query_string=query)
            assert answer.status_code == 200, (key, value, answer.data[:300])
            assert answer.json["total"] == expected(key, value), (key, value)
            assert answer.json["total"] > 0
            if key not in ("service", "host", "instance"):
                assert answer.json["selection"]["label"] == [query["label"]]
            tried += 1
    assert tried == 19


@pytest.mark.parametrize("key", ["version", "host", "k:colon", " k ", '"q"'])
def test_a_split_lines_values_filter_to_their_own_samples(client, key):
    answer = client.get("/api/timeline", query_string={**WINDOW, "split": key})
    assert answer.status_code == 200, answer.data[:300]
    assert answer.json["split"] == key
    lines = answer.json["series"]
    assert lines
    for line in lines:
        value = line["value"]
        query = (
            {**WINDOW, key: value}
            if key == "host"
            else {**WINDOW, "label": label_param(key, value)}
        )
        total = client.get("/api/flamegraph", query_string=query).json["total"]
        assert total == line["total"] == expected(key, value) > 0


def test_a_route_and_an_instance_are_asked_for_exactly(client):
    # /api/slow-diff's route and /api/live's instance were stripped too.
    route = client.get("/api/slow-diff", query_string={**WINDOW, "route": " /r "})
    assert route.status_code == 200 and route.json["route"] == " /r "
    live = client.get("/api/live", query_string={"instance": " inst "})
    assert live.status_code == 400 and "' inst '" in live.json["error"]
