import pytest

from sampler.profile import (
    FoldedFormatError,
    build_tree,
    escape_frame,
    format_folded,
    parse_folded,
    subtract,
    unescape_frame,
)


@pytest.mark.parametrize(
    "name", ["a;b", "x\ny", "50%", "tab\there", "<img src=x onerror=alert(1)>", "ok:name"]
)
def test_escape_round_trips_and_is_safe(name):
    escaped = escape_frame(name)
    assert ";" not in escaped and "\n" not in escaped and "\t" not in escaped
    assert unescape_frame(escaped) == name


def test_format_then_parse_round_trips():
    counts = {"a;b;c": 3, "a;b": 1, "a with space;z": 7}
    assert parse_folded(format_folded(counts)) == counts


def test_parse_sums_repeats_and_names_bad_lines():
    assert parse_folded("a;b 1\n\na;b 2\n") == {"a;b": 3}
    with pytest.raises(FoldedFormatError, match="line 2"):
        parse_folded("a 1\nb x\n")
    with pytest.raises(FoldedFormatError, match="line 1"):
        parse_folded("nocount\n")
    assert parse_folded("a 1\n 2\n") == {"a": 1, "[no frames]": 2}


def test_subtract_never_negative():
    assert subtract({"a": 5, "b": 1}, {"a": 2, "b": 4, "c": 1}) == {"a": 3}


def test_build_tree_totals_and_self():
    root = build_tree({"a;b": 3, "a": 2, "c": 1})
    assert root.total == 6
    a = root.children["a"]
    assert a.total == 5 and a.self_count == 2
    assert a.children["b"].self_count == 3


@pytest.mark.parametrize("name", ['say "hi"', "back\\slash", "é ünïcode", "ctl\x01\x7f"])
def test_escaped_frames_need_no_json_escaping(name):
    import json

    escaped = escape_frame(name)
    assert json.dumps(escaped, ensure_ascii=False) == f'"{escaped}"'
    assert unescape_frame(escaped) == name
