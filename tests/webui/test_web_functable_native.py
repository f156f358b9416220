"""The function index's C path (the sampler's extension) against its Python path."""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path

import pytest
from test_web_functable import NATIVE, Reader

from sampler.profile.frames import escape_frame
from webui import functable
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
    monkeypatch.setattr(functable, "_NATIVE_CHUNK", 7)  # calls end in the middle of things
    monkeypatch.setattr(functable, "_FILE_CHUNK", 11)
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
    assert NATIVE.number_functions([], ";", {}, []) == []
    assert NATIVE.file_functions([], 0, 0) == ({}, {})
