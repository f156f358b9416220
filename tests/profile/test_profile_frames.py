"""Frame escaping, one definition in Python and its JavaScript twin, against one fixture of
hostile names (tests/data/hostile_frames.json)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sampler.profile import (
    display_frames,
    escape_frame,
    format_folded,
    join_frames,
    parse_folded,
    shown_frame,
    split_frames,
    split_line_number,
    stack_problem,
    thread_frame,
    unescape_frame,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "hostile_frames.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["frames"]
NAMES = [case["name"] for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_python_escapes_each_hostile_name_as_the_fixture_says(case):
    escaped = escape_frame(case["name"])
    assert escaped == case["escaped"]
    assert unescape_frame(escaped) == case.get("unescaped", case["name"])


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_an_escaped_frame_cannot_break_a_line_a_stack_or_a_json_string(case):
    escaped = escape_frame(case["name"])
    assert not any(ord(c) < 32 or c in ';"\\\x7f' for c in escaped)
    assert json.dumps(escaped, ensure_ascii=False) == f'"{escaped}"'
    escaped.encode()  # UTF-8, as the wire: no lone surrogate is left
    counts = {join_frames(["root", escaped, "leaf"]): 3}
    assert parse_folded(format_folded(counts)) == counts
    shown = case.get("unescaped", case["name"])
    assert display_frames(join_frames(["root", escaped])) == ["root", shown]


def test_every_control_character_and_the_separators_are_in_the_fixture():
    together = "".join(NAMES)
    assert all(chr(c) in together for c in [*range(32), 0x7F])
    assert all(c in together for c in ';%"\\\u2028\u0085')


def test_javascript_escapes_the_fixture_as_python_does(tmp_path):
    node = shutil.which("node")
    assert node, "node is needed (make setup installs the npm packages)"
    out = subprocess.run(
        [
            node,
            str(ROOT / "tests" / "profile" / "frames_check.mjs"),
            str(ROOT / "webui" / "static" / "js" / "frames.js"),
            str(FIXTURE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    js = json.loads(out.stdout)
    assert js["escaped"] == [case["escaped"] for case in CASES]
    unescaped = [case.get("unescaped", case["name"]) for case in CASES]
    assert js["unescaped"] == unescaped
    assert js["folded"] == join_frames([escape_frame(name) for name in NAMES])
    assert js["display"] == unescaped
    assert js["shown"] == [case["shown"] for case in CASES]


def test_invisible_characters_are_shown_written_out():
    # U+202E reverses what follows: "gnp.exe" would read "exe.png".
    assert shown_frame("evil:f\u202egnp.exe") == "evil:f[U+202E]gnp.exe"
    assert shown_frame("a\u2066b\u2069\u200b\ufeff") == "a[U+2066]b[U+2069][U+200B][U+FEFF]"
    assert shown_frame("app.views:upload") == "app.views:upload"
    assert [shown_frame(case["name"]) for case in CASES] == [case["shown"] for case in CASES]
    assert sum(case["shown"] != case["name"] for case in CASES) >= 5


def test_frames_split_join_and_name_threads():
    stack = join_frames(["[thread:a%3Bb]", "m:f", "m:g%0A"])
    assert split_frames(stack) == ["[thread:a%3Bb]", "m:f", "m:g%0A"]
    assert display_frames(stack) == ["[thread:a;b]", "m:f", "m:g\n"]
    assert thread_frame("a;b") == "[thread:a%3Bb]"


def test_line_numbers_split_off_a_frame():
    assert split_line_number("app.views:upload:42") == ("app.views:upload", 42)
    assert split_line_number("app.views:upload") == ("app.views:upload", 0)
    assert split_line_number("main:7") == ("main:7", 0)  # a qualname named 7, no line


@pytest.mark.parametrize(
    ("stack", "problem"),
    [
        ("a;b", None),
        ("", "non-empty"),
        (7, "non-empty"),
        ("a;;b", "empty frame"),
        (";a", "empty frame"),
        ("a;", "empty frame"),
        ("a\nb", "control character"),
        ("a\ud800", "lone surrogate"),
        ("x" * 11, "longer than the limit of 10"),
    ],
)
def test_stack_problems_are_named(stack, problem):
    found = stack_problem(stack, 10)
    assert found is None if problem is None else problem in found
