"""Function tables and time parsing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from webui.model import (
    choose_step,
    fill_timeline,
    parse_duration,
    parse_time,
    rank_changes,
    top_functions,
)

NOW = 1_795_000_000


def test_top_functions_count_recursion_once_and_unescape():
    top = top_functions({"main;f;f;g": 5, "main;f": 3, "main;g": 2, "m:a%3Bb": 10})
    by_name = {f["name"]: f for f in top}
    assert (by_name["f"]["self"], by_name["f"]["total"]) == (3, 8)
    assert (by_name["g"]["self"], by_name["g"]["total"]) == (7, 7)
    assert by_name["main"]["total_share"] == pytest.approx(0.5)
    assert top[0]["name"] == "m:a;b" and top[0]["self_share"] == pytest.approx(0.5)
    assert [f["name"] for f in top_functions({"main;a": 5, "main;b": 5}, limit=2)] == ["a", "b"]


def test_rank_changes_by_share_not_by_count():
    a = {"main;parse": 50, "main;render": 50}
    b = {"main;parse": 100, "main;render": 300}  # render grew from 50% to 75%
    ranked = rank_changes(a, b)
    first = ranked[0]
    assert first.name in ("render", "parse")
    assert abs(first.self_delta) == pytest.approx(0.25)
    by_name = {c.name: c for c in ranked}
    assert by_name["render"].self_delta == pytest.approx(0.25)
    assert by_name["parse"].self_delta == pytest.approx(-0.25)
    assert by_name["main"].total_delta == pytest.approx(0.0)
    assert by_name["render"].to_dict()["self_delta"] == pytest.approx(0.25)


def test_rank_changes_new_function_and_order_total():
    ranked = rank_changes({"m;a": 10}, {"m;a": 5, "m;b;c": 5}, order="total")
    # a, b and c all moved 50% of total; a and c also moved 50% of self, b none.
    assert [c.name for c in ranked] == ["a", "c", "b", "m"]
    assert [c.total_delta for c in ranked[:3]] == pytest.approx([-0.5, 0.5, 0.5])
    assert len(rank_changes({"m;a": 10}, {"m;b": 1}, limit=2)) == 2
    with pytest.raises(ValueError, match="order"):
        rank_changes({}, {}, order="name")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("-15m", NOW - 900),
        ("-1h", NOW - 3600),
        ("now-1h30m", NOW - 5400),
        ("-7d", NOW - 7 * 86400),
        ("-2w", NOW - 14 * 86400),
        ("-30s", NOW - 30),
        ("1700000000", 1_700_000_000),
        ("1700000000.9", 1_700_000_000),
        ("1700000000123", 1_700_000_000),
        ("2026-01-31T12:00:00Z", int(datetime(2026, 1, 31, 12, tzinfo=timezone.utc).timestamp())),
        ("2026-01-31T12:00:00", int(datetime(2026, 1, 31, 12, tzinfo=timezone.utc).timestamp())),
        (
            "2026-01-31T14:00:00+02:00",
            int(datetime(2026, 1, 31, 12, tzinfo=timezone.utc).timestamp()),
        ),
        ("2026-01-31", int(datetime(2026, 1, 31, tzinfo=timezone.utc).timestamp())),
    ],
)
def test_parse_time_forms(text, expected):
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "-1y", "1h", "--1h", "2026-13-01", "-1h-2m"])
def test_parse_time_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_time(text, NOW)


def test_parse_duration():
    assert parse_duration("1h30m") == 5400
    for bad in ("", "h", "10", "1x"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_choose_step_bounds_the_points():
    assert choose_step(0, 900, 60) == 60
    assert choose_step(0, 86400, 60) == 300  # 288 points
    assert choose_step(0, 7 * 86400, 60) == 1800  # 336 points
    assert choose_step(0, 3600, 45) % 45 == 0
    assert choose_step(0, 10**9, 60) % 60 == 0 and 10**9 / choose_step(0, 10**9, 60) <= 400


def test_fill_timeline_has_every_step():
    assert fill_timeline([(120, 5)], 61, 300, 60) == [(60, 0), (120, 5), (180, 0), (240, 0)]
