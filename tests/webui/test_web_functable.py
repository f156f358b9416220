"""The function index: function tables of windows by function, against counting frames."""

from __future__ import annotations

import random

import pytest

from collector.functions import FunctionSamples
from webui import functable_numbering
from webui.functable import FunctionIndex
from webui.model import StackIndex, top_functions

NATIVE = functable_numbering.native_functions()


@pytest.fixture(autouse=True, params=["c", "python"])
def numbering(request, monkeypatch) -> str:
    """Every test on both paths: the sampler's C extension where it is built, and the Python
    loops (the fallback without it)."""
    if request.param == "c" and NATIVE is None:
        pytest.skip("the sampler's C extension is not built")
    if request.param == "python":
        monkeypatch.setattr(functable_numbering, "native_functions", lambda: None)
    return str(request.param)


FRAMES = ["m:main", "a:f", "b:g", "c:h", "c:h:12", "d:%3Bsemi", "r:rec", "x:leaf"]


def fleet(n: int, seed: int = 3) -> dict[int, str]:
    """``n`` distinct stacks by id: shared roots, recursion, an empty stack."""
    rng = random.Random(seed)
    stacks = {"", "r:rec;r:rec;a:f;r:rec"}
    while len(stacks) < n:
        stacks.add(";".join(["m:main", *rng.choices(FRAMES, k=rng.randint(1, 7))]))
    return {1000 + i: text for i, text in enumerate(sorted(stacks))}


class Reader:
    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts
        self.reads: list[int] = []

    def __call__(self, ids: list[int]) -> tuple[list[int], str]:
        self.reads.append(len(ids))
        found = [sid for sid in ids if sid in self.texts]
        return found, "\n".join(self.texts[sid] for sid in found)


def by_text(texts: dict[int, str], counts: dict[int, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sid, count in counts.items():
        out[texts[sid]] = out.get(texts[sid], 0) + count
    return out


def test_tables_equal_counting_frames_stack_by_stack() -> None:
    texts = fleet(300)
    index = FunctionIndex(Reader(texts))
    rng = random.Random(1)
    for size in (300, 200, 40, 5, 1):  # large windows by function, small ones by stack
        counts = {sid: rng.randint(0, 9) for sid in rng.sample(sorted(texts), size)}
        expected = FunctionSamples.of(by_text(texts, counts))
        assert index.table(counts) == expected, size
        for limit in (1, 2, 3, 50):
            assert top_functions(index.table(counts, limit=limit), limit=limit) == top_functions(
                expected, limit=limit
            ), (size, limit)


def test_a_limited_table_sums_only_what_can_rank() -> None:
    texts = fleet(300)
    index = FunctionIndex(Reader(texts))
    counts = dict.fromkeys(texts, 1)
    full, top = index.table(counts), index.table(counts, limit=2)
    assert top.self_counts == full.self_counts and top.total == full.total
    assert set(top.totals) < set(full.totals)  # the root, with no self samples, is left out
    assert "m:main" in full.totals and "m:main" not in top.totals


def test_a_matched_table_holds_every_matching_function_with_its_total() -> None:
    texts = fleet(300)
    index = FunctionIndex(Reader(texts))
    rng = random.Random(2)
    for size in (300, 5):  # by function, and by stack
        counts = {sid: rng.randint(1, 9) for sid in rng.sample(sorted(texts), size)}
        full = index.table(counts)
        for wanted in ({"m:main"}, {"c:h", "c:h:12", "d:%3Bsemi"}, set()):
            found = index.table(counts, limit=1, match=wanted.__contains__)
            assert found.totals == {n: c for n, c in full.totals.items() if n in wanted}
            assert found.self_counts == {n: c for n, c in full.self_counts.items() if n in wanted}
            assert found.total == full.total, (size, wanted)


def test_stacks_are_read_once_and_unknown_ones_named() -> None:
    texts = fleet(50)
    reader = Reader(texts)
    index = FunctionIndex(reader)
    index.table(dict.fromkeys(texts, 2))
    index.table(dict.fromkeys(list(texts)[:10], 1))
    assert reader.reads == [50] and len(index) == 50
    table = index.table({42: 3})  # not stored: its own function, named after its id
    assert table.self_counts == {"[unknown stack 42]": 3}


def test_the_bound_starts_over_and_warming_stays_within_its_share() -> None:
    texts = fleet(200)
    index = FunctionIndex(Reader(texts), max_bytes=20_000)
    ids = sorted(texts)
    assert not index.warm(ids, share=0.5)  # only part of them fit
    warmed = len(index)
    assert 0 < warmed < 200
    assert index.warm(ids[:1], share=0.5)  # known already
    counts = dict.fromkeys(ids[100:], 1)  # a window beyond the bound: held alone
    assert index.table(counts) == FunctionSamples.of(by_text(texts, counts))
    assert len(index) == 100


def test_stacks_the_stack_index_knows_are_not_read_again() -> None:
    texts = fleet(300)
    stacks = StackIndex(Reader(texts))
    ids = sorted(texts)
    stacks.arrange([dict.fromkeys(ids[:200], 1)])  # a view read these
    stacks.arrange([{42: 1}])  # not stored when viewed: known by a placeholder
    texts[42] = "m:main;late:f"  # stored since
    store = Reader(texts)
    index = FunctionIndex(store, known_keys=stacks.keys_of)
    counts = dict.fromkeys([*ids, 42], 1)
    assert index.table(counts) == FunctionSamples.of(by_text(texts, counts))
    assert store.reads == [101]  # what the stack index lacked, and the placeholder again
