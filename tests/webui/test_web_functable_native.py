"""The function index's C path (the sampler's extension) against its Python path."""

from __future__ import annotations

import json
import random
import time
from array import array
from pathlib import Path

import pytest
from test_web_functable import NATIVE, Reader

from sampler.profile.frames import escape_frame
from webui import functable_numbering
from webui.functable import FunctionIndex

HOSTILE = Path(__file__).parents[1] / "data" / "hostile_frames.json"
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the sampler's C extension is not built")


def state(index: FunctionIndex) -> tuple:
    """Everything the index holds, to compare the two paths."""
    return (
        index._names,
        index._numbers,
        index._ordinals,
        index._functions,
        index._stacks_of,
        index._leaf_of,
        index._bytes,
    )


def varied_texts(n: int, seed: int) -> dict[int, str]:
    """Stacks of hostile names (the shared fixture, escaped as the sampler does), names of
    every width of character, recursion, empty frames and the empty stack."""
    frames = [escape_frame(case["name"]) for case in json.loads(HOSTILE.read_text())["frames"]]
    frames += ["m:café", "m:日本語", "m:\U0001f525fire", "m:ok", "", "m:ok:12"]
    rng = random.Random(seed)
    texts = {"", ";", "m:ok;;m:ok", "m:ok;m:ok;m:ok"}
    while len(texts) < n:
        texts.add(";".join(rng.choices(frames, k=rng.randint(1, 40))))
    return {5000 + i: text for i, text in enumerate(sorted(texts))}


def test_the_c_path_numbers_and_files_as_the_python_path(monkeypatch) -> None:
    # Calls end in the middle of things.
    monkeypatch.setattr(functable_numbering, "_NATIVE_CHARS", 300)
    monkeypatch.setattr(functable_numbering, "_FILE_CHUNK", 11)
    indexes = {}
    texts = varied_texts(400, seed=5)
    for path in ("c", "python"):
        index = indexes[path] = FunctionIndex(Reader(texts))
        if path == "python":
            index.native = None
        ids = sorted(texts)
        for part in (ids[:13], ids[13:200], ids[150:], [1, 2]):  # in pieces, and unknown ids
            index.table(dict.fromkeys(part, 1))
    assert indexes["c"].native is NATIVE and indexes["python"].native is None
    assert state(indexes["c"]) == state(indexes["python"])
    assert any(len(name) != len(name.encode()) for name in indexes["c"]._names)  # wide ones


def test_the_c_functions_refuse_what_they_cannot_number() -> None:
    with pytest.raises(TypeError):
        NATIVE.number_functions(["a;b", 3], ";", {}, [])
    with pytest.raises(ValueError, match="one character"):
        NATIVE.number_functions(["a;b"], ";;", {}, [])
    with pytest.raises(ValueError, match="positive"):
        NATIVE.number_functions(["a;b"], ";", {"a": -1}, [])
    with pytest.raises(TypeError, match="'i'"):
        NATIVE.file_functions([array("q", [0])], 0, 1)
    with pytest.raises(ValueError, match="past the functions"):
        NATIVE.file_functions([array("i", [0, 5])], 0, 5)
    with pytest.raises(ValueError):
        NATIVE.file_functions([array("i", [0])], 2**31, 1)
    with pytest.raises(ValueError):
        NATIVE.file_functions([array("i", [5])], 0, 2**62)  # more functions than an int holds
    assert NATIVE.number_functions([], ";", {}, []) == []
    assert NATIVE.file_functions([], 0, 0) == ({}, {})
    last = 2**31 - 1  # the last ordinal an int holds
    assert NATIVE.file_functions([array("i", [0])], last, 1) == (
        {0: array("i", [last]).tobytes()},
        {0: array("i", [last]).tobytes()},
    )


class FailingSecondCall:
    """The C extension, but its second call to number stacks fails."""

    def __init__(self) -> None:
        self.calls = 0

    def number_functions(self, *args):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 2:
            raise MemoryError
        return NATIVE.number_functions(*args)

    def file_functions(self, *args):  # type: ignore[no-untyped-def]
        return NATIVE.file_functions(*args)


def test_stacks_numbered_before_a_failure_are_not_kept_unfiled(monkeypatch) -> None:
    monkeypatch.setattr(functable_numbering, "_NATIVE_CHARS", 300)
    texts = varied_texts(100, seed=2)
    index = FunctionIndex(Reader(texts))
    index.native = FailingSecondCall()
    with pytest.raises(MemoryError):
        index.table(dict.fromkeys(texts, 1))
    assert index._functions == [] and len(index._stacks_of) == len(index._names)
    index.native = NATIVE
    expected = FunctionIndex(Reader(texts))
    expected.native = None
    assert index.table(dict.fromkeys(texts, 1)) == expected.table(dict.fromkeys(texts, 1))


@pytest.mark.alone
def test_names_made_to_collide_cost_about_what_others_do() -> None:
    # FNV-1a's low bits depend only on the characters' low bits: names of these three
    # characters all fell in one slot of the table, and each call went quadratic (20,000
    # such names took 0.7 s against 0.008 s; a chunk of them, ~50 s holding the GIL).
    def names(alphabet: str, count: int) -> list[str]:
        rng = random.Random(4)
        found: set[str] = set()
        while len(found) < count:
            found.add("".join(rng.choices(alphabet, k=12)))
        return sorted(found)

    def seconds(texts: list[str]) -> float:
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            NATIVE.number_functions(texts, ";", {}, [])
            best = min(best, time.perf_counter() - began)
        return best

    colliding = names("A\U00080041\U00100041", 20_000)
    plain = names("ABCDEFGHIJKLMNOP", 20_000)
    assert seconds(colliding) < 10 * seconds(plain)
