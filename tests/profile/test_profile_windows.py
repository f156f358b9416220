"""Bucket alignment and time windows."""

from __future__ import annotations

import pytest

from sampler.profile import (
    BUCKET_SECONDS,
    Window,
    WindowError,
    align_down,
    align_up,
    bucket_of,
    bucket_starts,
    buckets_in,
    is_settled,
    parse_time,
    parse_window,
)

NOW = 1_795_000_020


def test_alignment():
    assert BUCKET_SECONDS == 60
    assert (align_down(125, 60), align_up(125, 60), align_up(120, 60)) == (120, 180, 120)
    assert bucket_of(179.99) == 120 and bucket_of(180, 3600) == 0
    assert align_down(-1, 60) == -60  # floor, before the epoch too


@pytest.mark.parametrize(
    ("start", "end", "width", "count"),
    [(0, 60, 60, 1), (1, 60, 60, 0), (0, 61, 60, 2), (59, 121, 60, 2), (120, 60, 60, 0)],
)
def test_buckets_starting_in_a_window(start, end, width, count):
    assert buckets_in(start, end, width) == count
    assert count == sum(1 for b in range(start - start % width, end, width) if b >= start)


def test_bucket_starts_cover_the_window():
    assert list(bucket_starts(61, 300, 60)) == [60, 120, 180, 240]


def test_windows_are_half_open_and_never_empty():
    window = Window(60, 180)
    assert 60 in window and 179 in window and 180 not in window
    assert window.seconds == 120 and window.aligned(100) == Window(0, 200)
    with pytest.raises(WindowError) as error:
        Window(5, 5)
    assert error.value.side == "start"


def test_parse_window_names_the_wrong_side():
    assert parse_window("-1h", "now", NOW) == Window(NOW - 3600, NOW)
    for texts, side in ((("soon", "now"), "start"), (("-1h", "later"), "end")):
        with pytest.raises(WindowError) as error:
            parse_window(*texts, NOW)
        assert error.value.side == side


def test_a_window_settles_two_buckets_after_its_end():
    assert is_settled(NOW - 120, NOW) and not is_settled(NOW - 119, NOW)
    assert is_settled(NOW - 20, NOW, bucket_seconds=10)


@pytest.mark.parametrize(
    "text",
    [
        "9" * 309,
        "9" * 400,
        "1" + "0" * 40,
        "0001-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "-60000w",
    ],
)
def test_times_out_of_range_are_value_errors_not_overflows(text):
    # 309 digits and more are infinite as floats; year 1 is a negative epoch second.
    with pytest.raises(ValueError, match="out of range"):
        parse_time(text, 1_800_000_000)


def test_the_range_ends_are_accepted():
    assert parse_time("1970-01-01T00:00:00Z", 0) == 0
    assert parse_time("9999-12-31T23:59:59Z", 0) == 253402300799
