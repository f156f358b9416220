"""The stack index: windows of stack ids put in the same order as sorting their text would."""

from __future__ import annotations

import random
import threading
from itertools import compress

from test_web_model_tree import as_plain, random_profile

from webui.model import (
    FunctionSamples,
    SortedStacks,
    StackIndex,
    diff_tree,
    diff_tree_sorted,
    flame_tree,
    flame_tree_sorted,
)
from webui.model.flametree import sort_stacks


def catalogue(rng: random.Random, stacks: int) -> dict[int, str]:
    """Stack ids (large, like the store's hashes) to folded text, with awkward names."""
    texts = set(random_profile(rng, stacks * 2))
    texts |= {"", "a", "a;b", "a b;c", "a\x01b;c", "x;y\nz"}
    return {rng.getrandbits(63): text for text in sorted(texts)}


class Names:
    """A reader of stack text as the store's (Query.stack_lines) that counts what it was
    asked for."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.asked: list[int] = []

    def __call__(self, ids: list[int]) -> tuple[list[int], str]:
        self.asked += ids
        found = sorted(sid for sid in ids if sid in self.names)  # not in the order asked
        return found, "\n".join(self.names[sid].replace("\n", "%0A") for sid in found)


def window(rng: random.Random, names: dict[int, str], size: int) -> dict[int, int]:
    return {sid: rng.randint(1, 50) for sid in rng.sample(sorted(names), size)}


def by_text(names: dict[int, str], counts: dict[int, int]) -> dict[str, int]:
    return {names[sid]: count for sid, count in counts.items()}


def with_samples(stacks: SortedStacks) -> tuple[list[str], list[list[int]]]:
    """The keys and counts of the stacks with samples (an index's order holds them all)."""
    keep = list(map(any, zip(*stacks.values, strict=True)))
    return list(compress(stacks.keys, keep)), [list(compress(v, keep)) for v in stacks.values]


def test_windows_come_out_as_sorting_their_text_would():
    rng = random.Random(5)
    names = catalogue(rng, 400)
    reader = Names(names)
    index = StackIndex(reader)
    # Small windows first (sorted), then one holding most stacks (spread over the index).
    seen: set[int] = set()
    for size in (10, 50, 200, len(names) - 3, 30):
        counts = window(rng, names, size)
        seen |= set(counts)
        assert with_samples(index.arrange([counts])) == with_samples(
            sort_stacks([by_text(names, counts)])
        )
    assert len(index) == len(seen)
    assert sorted(reader.asked) == sorted(set(reader.asked))  # each name read once


def test_two_profiles_are_aligned_with_zeros_where_one_lacks_a_stack():
    rng = random.Random(6)
    names = catalogue(rng, 200)
    index = StackIndex(Names(names))
    a, b = window(rng, names, 120), window(rng, names, 90)
    arranged = index.arrange([a, b])
    assert with_samples(arranged) == with_samples(
        sort_stacks([by_text(names, a), by_text(names, b)])
    )
    folded_a, folded_b = by_text(names, a), by_text(names, b)
    assert as_plain(diff_tree_sorted(arranged).root) == as_plain(diff_tree(folded_a, folded_b).root)


def test_trees_from_the_index_equal_trees_from_folded_text():
    rng = random.Random(7)
    names = catalogue(rng, 300)
    index = StackIndex(Names(names))
    index.arrange([dict.fromkeys(names, 1)])  # knows every stack: windows leave gaps in it
    for size in (len(names), 250, 100):
        counts = window(rng, names, size)
        for max_nodes in (2, 3, 40, 5000):
            for min_share in (0.0, 0.01):
                arranged = index.arrange([counts])
                sorted_tree = flame_tree_sorted(arranged, max_nodes=max_nodes, min_share=min_share)
                text_tree = flame_tree(
                    by_text(names, counts), max_nodes=max_nodes, min_share=min_share
                )
                assert sorted_tree.to_dict() == text_tree.to_dict()
        other = window(rng, names, size // 2)
        for max_nodes in (2, 40, 5000):
            sorted_diff = diff_tree_sorted(index.arrange([counts, other]), max_nodes=max_nodes)
            text_diff = diff_tree(
                by_text(names, counts), by_text(names, other), max_nodes=max_nodes
            )
            assert sorted_diff.to_dict() == text_diff.to_dict()


def test_node_boundaries_are_remembered_for_the_index_keys():
    rng = random.Random(13)
    names = catalogue(rng, 300)
    index = StackIndex(Names(names))
    counts = window(rng, names, 250)
    arranged = index.arrange([counts])
    assert arranged.bounds is not None and arranged.keys is index.arrange([counts]).keys
    first = flame_tree_sorted(arranged, max_nodes=200).to_dict()
    remembered = len(arranged.bounds.ends)
    assert remembered > 0
    assert flame_tree_sorted(index.arrange([counts]), max_nodes=200).to_dict() == first
    assert len(arranged.bounds.ends) == remembered  # found nothing new the second time
    # Two requests that miss at once: the second finds the first learned the stacks already,
    # and what was remembered stays.
    assert index._learn(list(counts)) is index._state
    assert index.arrange([counts]).bounds is arranged.bounds


def test_folded_gives_back_the_text():
    rng = random.Random(8)
    names = {sid: text for sid, text in catalogue(rng, 100).items() if "\x01" not in text}
    index = StackIndex(Names(names))
    counts = window(rng, names, 60)
    assert index.folded(counts) == by_text(names, counts)


def test_an_unknown_id_gets_a_name_and_does_not_break_the_order():
    names = {1: "a;b", 2: "a"}
    index = StackIndex(Names(names))
    arranged = index.arrange([{1: 3, 2: 4, 99: 5}])
    assert index.folded({99: 5}) == {"[unknown stack 99]": 5}
    assert sum(arranged.values[0]) == 12


def test_past_its_budget_the_index_starts_over_with_the_window():
    rng = random.Random(9)
    names = catalogue(rng, 300)
    reader = Names(names)
    index = StackIndex(reader, max_bytes=2_000)
    first = window(rng, names, 40)
    index.arrange([first])
    for _ in range(5):
        counts = window(rng, names, 40)
        assert with_samples(index.arrange([counts])) == with_samples(
            sort_stacks([by_text(names, counts)])
        )
        assert index._bytes <= 2_000 or len(index) <= len(counts)
    # Everything it holds is right: the window it was filled by comes out right again.
    assert with_samples(index.arrange([counts])) == with_samples(
        sort_stacks([by_text(names, counts)])
    )


def test_concurrent_readers_all_get_their_own_window_in_order():
    rng = random.Random(10)
    names = catalogue(rng, 500)
    index = StackIndex(Names(names))
    windows = [window(rng, names, rng.randint(20, 300)) for _ in range(16)]
    expected = [with_samples(sort_stacks([by_text(names, w)])) for w in windows]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = with_samples(index.arrange([windows[i]]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(windows))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i] for i in range(len(windows))] == expected


def test_function_samples_match_counting_the_folded_text():
    rng = random.Random(11)
    # Control characters are escaped in sort keys (the store never holds them anyway).
    names = {sid: text for sid, text in catalogue(rng, 300).items() if "\x01" not in text}
    names = {sid: text for sid, text in names.items() if "\n" not in text}
    names[7] = "r;a;r;a;r"  # recursion counts once per stack
    index = StackIndex(Names(names))
    for size in (250, 40):
        counts = window(rng, names, size) | {7: 9}
        counts[next(iter(counts))] = 0  # a stack without samples counts for nothing
        expected = FunctionSamples.of(by_text(names, counts))
        assert index.function_samples(counts) == expected
    assert index.function_samples({7: 9}).totals == {"r": 9, "a": 9}


def test_the_frame_cache_starts_over_past_its_budget():
    rng = random.Random(12)
    names = {sid: text for sid, text in catalogue(rng, 300).items() if "\x01" not in text}
    names = {sid: text for sid, text in names.items() if "\n" not in text}
    index = StackIndex(Names(names), max_bytes=40_000)
    for _ in range(6):
        counts = window(rng, names, 60)
        assert index.function_samples(counts) == FunctionSamples.of(by_text(names, counts))
        assert index._bytes + index._frame_bytes <= 40_000 + 60 * (150 + 8 * 20)


def test_warming_learns_stacks_in_the_order_given_a_chunk_at_a_time():
    rng = random.Random(11)
    names = catalogue(rng, 300)
    order = rng.sample(sorted(names), len(names))
    reads: list[list[int]] = []
    reader = Names(names)
    index = StackIndex(lambda ids: reads.append(ids) or reader(ids), max_bytes=200_000)
    known = window(rng, names, 20)
    index.arrange([known])
    learned, room = index.warm(order, share=0.5, chunk=64)
    # Skipping what it knew, in the order given, as far as half the bound holds them.
    assert not room and 0 < learned < len(names) - len(known)
    assert 100_000 - per_stack(names) < index._bytes <= 100_000
    assert len(index) == len(known) + learned
    expected = [sid for sid in order if sid not in known][:learned]
    assert max(map(len, reads[1:])) <= 64 and len(reads) > 3  # the last read more than fitted
    assert sum(reads[1:], [])[:learned] == expected
    # What it learned is in order: a window of it reads nothing more.
    chunks = len(reads)
    counts = {sid: 1 for sid in expected}
    assert with_samples(index.arrange([counts])) == with_samples(
        sort_stacks([by_text(names, counts)])
    )
    assert len(reads) == chunks
    assert index.warm(order, share=0.5) == (0, False)  # full: reads nothing
    assert len(reads) == chunks
    # With room for all, it says there may be more.
    assert StackIndex(Names(names)).warm(order[:10], chunk=3) == (10, True)


def test_a_chunk_larger_than_the_room_gives_the_first_stacks_that_fit():
    rng = random.Random(13)
    names = catalogue(rng, 100)
    order = rng.sample(sorted(names), len(names))
    index = StackIndex(Names(names), max_bytes=20 * per_stack(names))
    learned, room = index.warm(order, share=0.5, chunk=len(order))
    assert not room and 10 <= learned < len(order)
    reader = Names(names)
    index.read_lines = reader
    index.arrange([{sid: 1 for sid in order[:learned]}])
    assert reader.asked == []


def test_warming_stops_when_asked_and_never_makes_the_index_start_over():
    rng = random.Random(12)
    names = catalogue(rng, 200)
    everything = sorted(names)
    assert StackIndex(Names(names)).warm(everything, stop=lambda: True) == (0, True)
    # A request fills the index while warming goes on: warming then learns what still fits.
    index = StackIndex(Names(names), max_bytes=50 * per_stack(names))
    busy = {sid: 1 for sid in everything[-45:]}
    asked: list[int] = []

    def request_meanwhile() -> bool:
        if not asked:
            index.arrange([busy])
        asked.append(len(index))
        return False

    learned, room = index.warm(everything, share=1.0, chunk=10, stop=request_meanwhile)
    assert asked[0] == len(busy) and not room and index._bytes <= index.max_bytes
    assert len(index) == len(busy) + learned
    reader = Names(names)
    index.read_lines = reader
    index.arrange([busy])
    assert reader.asked == []  # the request's stacks are all still known


def per_stack(names: dict[int, str]) -> int:
    """The most memory the index counts for one of these stacks."""
    index = StackIndex(Names(names))
    longest = max(names, key=lambda sid: len(names[sid]))
    index.arrange([{longest: 1}])
    return index._bytes


def test_a_request_does_not_wait_for_a_warm_up_read_under_way():
    rng = random.Random(8)
    names = catalogue(rng, 300)
    reading, release = threading.Event(), threading.Event()
    reader = Names(names)
    events: list[str] = []

    def read(ids: list[int]) -> tuple[list[int], str]:
        if threading.current_thread().name == "warm-up":
            reading.set()
            release.wait(5)  # a request waiting for this read would wait these 5 s
            events.append("warm-up read")
        return reader(ids)

    index = StackIndex(read)
    ids = sorted(names)
    warmed: list[tuple[int, bool]] = []
    warm_up = threading.Thread(
        target=lambda: warmed.append(index.warm(ids[:200])), name="warm-up", daemon=True
    )
    warm_up.start()
    assert reading.wait(10)
    counts = window(rng, names, 150)
    try:
        # Served while the warm-up's read waits: its own read, not the warm-up's.
        stacks = index.arrange([counts])
        events.append("request served")
    finally:
        release.set()
    warm_up.join(10)
    assert events == ["request served", "warm-up read"]
    keys, values = with_samples(stacks)
    assert (keys, values) == with_samples(sort_stacks([by_text(names, counts)]))
    # The warm-up then adds only what the request did not learn meanwhile.
    assert warmed == [(len(set(ids[:200]) - set(counts)), True)]
    assert sorted(index.known()[1]) == sorted(set(ids[:200]) | set(counts))
    assert index.known()[0] == sorted(index.known()[0])


def test_an_empty_window_first_of_all_is_an_empty_tree():
    # A fresh server's first request for a window without samples: the index knows no stack,
    # and its remembered node boundaries must belong to its (empty) keys.
    index = StackIndex(Names({}))
    tree = flame_tree_sorted(index.arrange([{}]))
    assert tree.to_dict()["total"] == 0
    assert diff_tree_sorted(index.arrange([{}, {}])).to_dict()["tree"]["children"] == []


def test_a_few_new_stacks_are_merged_in_as_sorting_would():
    from webui.model.linesort import in_order, merged

    rng = random.Random(11)
    for _ in range(300):
        words = ["", "a", "b", "\x01", "a\x01", "\x01b", "ab\x01c", "é", "\ud800"]
        keys = sorted({"".join(rng.choices(words, k=rng.randint(0, 4))) for _ in range(200)})
        new = sorted({"".join(rng.choices(words, k=rng.randint(0, 5))) for _ in range(10)})
        new = [key for key in new if key not in set(keys)]
        ids, new_ids = [hash(k) for k in keys], [hash(k) for k in new]
        assert merged(keys, ids, new, new_ids) == in_order(keys + new, ids + new_ids)
