"""Stacks' lines made into sort keys in order: the sampler's C extension against Python."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sampler.profile import sort_keys
from sampler.profile.frames import escape_frame
from webui.model import linesort

NATIVE = linesort._native()
HOSTILE = Path(__file__).parents[1] / "data" / "hostile_frames.json"
native = pytest.mark.skipif(NATIVE is None, reason="the sampler's C extension is not built")


def python_path(lines: str, ids: list[int]) -> tuple[list[str], list[int]]:
    return linesort.in_order(linesort.sort_keys_of_lines(lines, len(ids)), ids)


def varied_stacks(n: int, seed: int, extra: tuple[str, ...] = ()) -> list[str]:
    """Stacks of the shared hostile names (escaped as the sampler does; those of Latin-1, which
    the C path sorts), prefixes of one another, recursion, empty frames and the empty stack."""
    frames = [escape_frame(case["name"]) for case in json.loads(HOSTILE.read_text())["frames"]]
    frames = [frame for frame in frames if all(ord(c) < 256 for c in frame)]
    frames += ["m:ok", "m:ok2", "m:o", "", "m:ok:12", "m: ok", "m:0k", "m:café", *extra]
    rng = random.Random(seed)
    stacks = ["", ";", "m:ok", "m:ok;m:ok", "m:ok;", "m:ok2;m:ok", "m:ok;m:ok2", "m:ok ;x"]
    while len(stacks) < n:
        stack = ";".join(rng.choices(frames, k=rng.randint(1, 30)))
        stacks.append(stack)
        if rng.random() < 0.2:  # a caller of it, and a sibling: long shared prefixes
            stacks.append(stack.rsplit(";", 1)[0])
            stacks.append(stack + ";m:ok")
    rng.shuffle(stacks)
    return stacks


@native
@pytest.mark.parametrize("seed", range(5))
def test_the_c_path_sorts_as_the_python_path(seed: int) -> None:
    stacks = varied_stacks(3000, seed)
    lines = "\n".join(stacks)
    assert "\n" not in "".join(stacks) and "\x01" not in lines and "\x02" not in lines
    assert len(set(lines) - set(map(chr, range(128)))) > 3  # Latin-1 past ASCII
    ids = [10_000 + i for i in range(len(stacks))]  # duplicate stacks too: ordered by line
    keys, in_order = NATIVE.sort_lines(lines, ids)
    assert (keys, in_order) == python_path(lines, ids)
    assert keys == sorted(sort_keys(stacks))
    assert sorted(in_order) == ids


@native
def test_keys_of_ascii_only_from_a_latin1_text_are_ordinary_str() -> None:
    lines = "m:café;x\nm:a;b\nm:é"
    keys, ids = NATIVE.sort_lines(lines, [1, 2, 3])
    assert keys == ["m:a\x01b", "m:café\x01x", "m:é"] and ids == [2, 1, 3]
    # Made as ASCII: equal and hashed as the same text made by Python.
    assert keys[0].isascii() and hash(keys[0]) == hash("m:a" + "\x01b")
    assert {keys[0]: 1}["m:a\x01b"] == 1


@native
@pytest.mark.parametrize(
    "lines",
    [
        "m:日本語;x\nm:a",  # past Latin-1
        "m:\U0001f525;x\nm:a",
        "m:a\x01b\nm:a",  # characters sort keys escape
        "m:a\x02b\nm:a",
        "a\nb\nc",  # more lines than ids
    ],
)
def test_the_c_path_leaves_to_python_what_it_does_not_sort(lines: str) -> None:
    assert NATIVE.sort_lines(lines, [1, 2]) is None
    if lines.count("\n") == 1:
        assert linesort.keys_in_order(lines, [1, 2]) == python_path(lines, [1, 2])
    else:
        with pytest.raises(ValueError, match="expected 2 stacks, got 3 lines"):
            linesort.keys_in_order(lines, [1, 2])


@native
def test_fewer_lines_than_ids_is_an_error_on_both_paths() -> None:
    with pytest.raises(ValueError, match="expected 3 stacks, got 2 lines"):
        NATIVE.sort_lines("a\nb", [1, 2, 3])
    with pytest.raises(ValueError, match="expected 3 stacks, got 2 lines"):
        python_path("a\nb", [1, 2, 3])


@pytest.mark.parametrize("with_native", [True, False])
def test_edges(monkeypatch, with_native: bool) -> None:
    if not with_native:
        monkeypatch.setattr(linesort, "_native", lambda: None)
    elif NATIVE is None:
        pytest.skip("the sampler's C extension is not built")
    assert linesort.keys_in_order("", []) == ([], [])
    assert linesort.keys_in_order("", [7]) == ([""], [7])
    assert linesort.keys_in_order("\n", [7, 8]) == (["", ""], [7, 8])
    assert linesort.keys_in_order("b;a\nb", [1, 2]) == (["b", "b\x01a"], [2, 1])
    ids = [3, 1, 2]
    linesort.keys_in_order("c\nb\na", ids)
    assert ids == [3, 1, 2]  # the caller's list is left as it was


@native
def test_the_c_path_is_taken(monkeypatch) -> None:
    def refuse(keys: list[str], ids: list[int]) -> tuple[list[str], list[int]]:
        raise AssertionError("the Python sort was used")

    monkeypatch.setattr(linesort, "in_order", refuse)
    assert linesort.keys_in_order("m:b\nm:a;x", [1, 2]) == (["m:a\x01x", "m:b"], [2, 1])


@native
@pytest.mark.parametrize("seed", range(4))
def test_the_c_merge_merges_as_sorting_the_two_runs_would(seed: int) -> None:
    rng = random.Random(seed)
    words = ["", "a", "b", "\x01", "a\x01", "é", "ÿ", "\u0100", "日本", "\U0001f525", "\ud800"]
    for _ in range(50):
        pool = ["".join(rng.choices(words, k=rng.randint(0, 4))) for _ in range(60)]
        keys, new = sorted(rng.sample(pool, 30)), sorted(rng.sample(pool, rng.randint(0, 30)))
        ids, new_ids = list(range(len(keys))), [100 + i for i in range(len(new))]
        # Equal keys in both runs: the first run's first, as a stable sort of the two.
        expected = linesort.in_order(keys + new, ids + new_ids)
        assert NATIVE.merge_sorted(keys, ids, new, new_ids) == expected
        assert linesort.merged(keys, ids, new, new_ids) == expected


@native
def test_the_c_merge_refuses_what_it_cannot_merge() -> None:
    with pytest.raises(TypeError, match="keys must be str"):
        NATIVE.merge_sorted(["a", 1], [1, 2], ["b"], [3])
    with pytest.raises(ValueError, match="as many ids as keys"):
        NATIVE.merge_sorted(["a"], [1, 2], ["b"], [3])
    assert NATIVE.merge_sorted([], [], ["b"], [3]) == (["b"], [3])
