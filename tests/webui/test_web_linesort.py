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


@native
def test_the_c_spread_lays_counts_at_their_ranks() -> None:
    rank = {sid: k for k, sid in enumerate([50, 10, 40, 20, 30])}
    counts = {40: 7, 50: 1, 30: 3}
    assert NATIVE.spread_counts(rank, counts, 5) == [1, 0, 7, 0, 3]
    assert NATIVE.spread_counts(rank, {}, 5) == [0] * 5
    assert NATIVE.spread_counts(rank, {40: 7, 99: 1}, 5) is None  # 99 has no rank
    with pytest.raises(KeyError):
        linesort.spread(rank, {40: 7, 99: 1}, 5)
    with pytest.raises(ValueError, match="a rank of 4 in 3 keys"):
        NATIVE.spread_counts(rank, {30: 1}, 3)
    with pytest.raises(ValueError, match="negative"):
        NATIVE.spread_counts(rank, counts, -1)
    with pytest.raises(TypeError):
        NATIVE.spread_counts(rank, list(counts.items()), 5)


@native
def test_a_window_is_laid_out_alike_with_and_without_the_c_spread(monkeypatch) -> None:
    from webui.model import StackIndex

    rng = random.Random(3)
    stacks = sorted(set(varied_stacks(400, 3)))
    names = {1000 + i: stack for i, stack in enumerate(stacks)}

    def read(ids: list[int]) -> tuple[list[int], str]:
        found = sorted(sid for sid in ids if sid in names)
        return found, "\n".join(names[sid] for sid in found)

    window = {sid: rng.randint(1, 9) for sid in rng.sample(sorted(names), 300)}
    index = StackIndex(read)
    spread_calls: list[int] = []
    real = NATIVE.spread_counts

    class Spy:
        def __getattr__(self, name: str) -> object:
            return getattr(NATIVE, name)

        def spread_counts(self, rank, counts, size):  # type: ignore[no-untyped-def]
            spread_calls.append(size)
            return real(rank, counts, size)

    monkeypatch.setattr(linesort, "_native", Spy)
    learned = index.arrange([window])  # its stacks unknown: learned first, then laid out
    with_c = index.arrange([window])
    assert spread_calls == [0, len(index), len(index)]  # the C path laid both out
    monkeypatch.setattr(linesort, "_native", lambda: None)
    without = index.arrange([window])
    assert with_c.keys == without.keys == learned.keys
    assert with_c.values == without.values == learned.values
    assert sum(with_c.values[0]) == sum(window.values())
