"""Query parameters read into selections; every error names its parameter."""

from __future__ import annotations

import pytest
from werkzeug.datastructures import MultiDict

from webui.params import (
    ParamError,
    label_param,
    parse_compare,
    parse_int,
    parse_label,
    parse_selection,
)

NOW = 1_795_000_000


def args(**kwargs):
    return MultiDict(
        [
            (k, v)
            for k, values in kwargs.items()
            for v in (values if isinstance(values, list) else [values])
        ]
    )


def test_defaults_and_filters():
    sel = parse_selection(
        args(service=["api", "worker"], host="web-1", label=["route:/a:b", "version:1.4.2"]), NOW
    )
    assert (sel.start, sel.end, sel.mode) == (NOW - 3600, NOW, "cpu")
    assert sel.services == ("api", "worker") and sel.hosts == ("web-1",)
    assert sel.labels == (("route", "/a:b"), ("version", "1.4.2"))  # split on the first colon
    assert parse_selection(args(), NOW, default_window="-15m").start == NOW - 900
    assert "api" in sel.describe() and "route=/a:b" in sel.describe()


def test_compare_sides_override_window_and_add_filters():
    a, b = parse_compare(
        args(service="api", a_from="-2h", a_to="-1h", a_label="version:1", b_label="version:2"),
        NOW,
    )
    assert (a.start, a.end) == (NOW - 7200, NOW - 3600)
    assert (b.start, b.end) == (NOW - 3600, NOW)
    assert a.services == b.services == ("api",)
    assert a.labels == (("version", "1"),) and b.labels == (("version", "2"),)


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ({"from": "soon"}, "from"),
        ({"to": "-"}, "to"),
        ({"from": "-1h", "to": "-2h"}, "from"),
        ({"mode": "heap"}, "mode"),
        ({"label": ":x"}, "label"),
        ({"label": '"":x'}, "label"),
        ({"label": "version"}, "label"),
        ({"label": "k:" + "v" * 1025}, "label"),
        ({"label": "k" * 257 + ":v"}, "label"),
        ({"label": "k:a\x00b"}, "label"),
        ({"host": "x" * 2000}, "host"),
        ({"service": "x" * 257}, "service"),
        ({"instance": "a\x00b"}, "instance"),
    ],
)
def test_errors_name_the_parameter(given, param):
    with pytest.raises(ParamError) as error:
        parse_selection(args(**given), NOW)
    assert error.value.param == param and str(error.value).startswith(param + ":")


def test_side_errors_name_the_prefixed_parameter():
    with pytest.raises(ParamError) as error:
        parse_compare(args(b_to="nope"), NOW)
    assert error.value.param == "b_to"


def test_parse_int_bounds():
    assert parse_int(args(), "n", 5, 1, 10) == 5
    assert parse_int(args(n="7"), "n", 5, 1, 10) == 7
    for bad in ("0", "11", "1.5", "x"):
        with pytest.raises(ParamError, match="^n:"):
            parse_int(args(n=bad), "n", 5, 1, 10)


# Names the store holds (the collector's validation takes any text but NUL and lone
# surrogates, keys up to 256 characters, label values up to 1,024).
STORED = [" host ", "space svc ", " 2.0 ", "a\tb", "new\nline", "V" * 1024, "évi\u202edé", "  "]


def test_filter_values_are_taken_exactly_as_the_store_holds_them():
    sel = parse_selection(
        args(service=STORED[1], host=[STORED[0], ""], instance="\t", label="version: 2.0 "), NOW
    )
    assert sel.services == ("space svc ",) and sel.hosts == (" host ",)
    assert sel.instances == ("\t",) and sel.labels == (("version", " 2.0 "),)
    assert parse_selection(args(label="route:"), NOW).labels == (("route", ""),)
    long = parse_selection(args(label="long:" + "V" * 1024), NOW)
    assert long.labels == (("long", "V" * 1024),)


@pytest.mark.parametrize("key", ["version", "k:colon", '"quoted"', "a\tb", ' "', ":", "k\\:"])
@pytest.mark.parametrize("value", ["1.4.2", "v:colon", "", *STORED])
def test_a_label_param_reads_back_as_its_key_and_value(key, value):
    written = label_param(key, value)
    assert parse_label(written) == (key, value)
    assert parse_selection(args(label=written), NOW).labels == ((key, value),)


def test_a_key_without_a_colon_is_written_as_before():
    assert label_param("version", "1.4.2") == "version:1.4.2"
    assert label_param("route", "/a:b") == "route:/a:b"
    assert label_param("k:colon", "v:colon") == '"k:colon":v:colon'
    # A key starting with a quote that is no JSON string followed by ':' is split as before.
    assert parse_label('"a"b:v') == ('"a"b', "v") and parse_label('"a:b') == ('"a', "b")
