"""Request rows as the store keeps them: packed sketches merge to exactly the sketch of the union,
rows stored before packing merge with them, and what no sampler sends is refused."""

import base64
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.request_rows import (
    HIGHEST_INDEX,
    LOWEST_INDEX,
    MAX_COUNT,
    SKETCHES,
    RequestFigures,
    SketchSum,
    pack_sketch,
)
from sampler._sketch import MIN_VALUE, Sketch, SketchError

values = st.one_of(
    st.floats(min_value=MIN_VALUE, max_value=86_400.0, allow_nan=False),
    st.sampled_from([0.0, -0.003]),
)
parts = st.lists(st.lists(values, max_size=200), min_size=1, max_size=8)


def sketch_of(data):
    sketch = Sketch()
    for value in data:
        sketch.add(value)
    return sketch


def stored(document):
    return json.loads(json.dumps(document))


@settings(max_examples=150, deadline=None)
@given(parts, st.lists(st.booleans(), min_size=8, max_size=8))
def test_packed_and_paired_documents_sum_to_the_sketch_of_the_union(chunks, packed):
    total = SketchSum()
    for chunk, pack in zip(chunks, packed, strict=False):
        sketch = sketch_of(chunk)
        total.add(stored(pack_sketch(sketch) if pack else sketch.document()))
    union = sketch_of([value for chunk in chunks for value in chunk])
    merged = total.sketch()
    assert merged.bins == union.bins
    assert (merged.zero, merged.count, merged.max) == (union.zero, union.count, union.max)
    assert merged.sum == pytest.approx(union.sum)
    for q in (0.0, 0.5, 0.99, 1.0):
        assert merged.quantile(q) == union.quantile(q)


def test_a_packed_sketch_is_smaller_than_its_pairs():
    sketch = sketch_of([0.001 * 1.01**i for i in range(700)])
    assert len(json.dumps(pack_sketch(sketch))) < len(json.dumps(sketch.document())) / 2


def counted(bins):
    """A sketch holding ``bins`` (index -> count), its count theirs."""
    sketch = Sketch()
    sketch.bins = dict(bins)
    sketch.count = sum(bins.values())
    return sketch


def test_counts_past_32_bits_add_without_carrying_into_the_next_bin():
    big = counted({-5: 2**40, -4: MAX_COUNT - 2**40 - 1, 3: 1})
    total = SketchSum()
    total.add(stored(pack_sketch(big)))
    total.add(stored(pack_sketch(big)))
    assert total.sketch().bins == {-5: 2**41, -4: 2 * (MAX_COUNT - 2**40 - 1), 3: 2}


def test_no_sum_of_documents_can_carry_a_field_into_the_next():
    # A field holds at most its documents' counts, and those must stay under 2**64: two
    # documents of 2**63 each in one bin would have read as one value in the next bin.
    with pytest.raises(SketchError, match="count"):
        pack_sketch(counted({-230: 2**63}))
    with pytest.raises(SketchError, match="count"):
        pack_sketch(Sketch.from_counts({-230: 5}, 0, 3, 0.1, 0.1))  # bins past the count
    total = SketchSum()
    document = stored(pack_sketch(counted({-230: MAX_COUNT})))
    for _ in range(2**64 // MAX_COUNT - 1):
        total.add(document)
    with pytest.raises(SketchError, match="values in all"):
        total.add(document)
    assert total.sketch().bins == {-230: (2**64 // MAX_COUNT - 1) * MAX_COUNT}


def test_the_widest_sketches_pack_and_merge_bin_for_bin():
    # From MIN_VALUE to MAX_VALUE: every bin a stored sketch may hold, split in two.
    bins = {index: index % 7 + 1 for index in range(LOWEST_INDEX, HIGHEST_INDEX + 1)}
    low = counted({index: n for index, n in bins.items() if index < 0})
    high = counted({index: n for index, n in bins.items() if index >= 0})
    total = SketchSum()
    total.add(stored(pack_sketch(high)))
    total.add(stored(pack_sketch(low)))
    expected = low.copy()
    expected.merge(high)
    assert total.sketch().bins == expected.bins
    assert len(json.dumps(pack_sketch(expected))) < 4000


def test_what_no_sampler_sends_is_refused():
    with pytest.raises(SketchError, match="index"):
        pack_sketch(counted({HIGHEST_INDEX + 10**9: 1}))  # a billion bins up: an endless row
    with pytest.raises(SketchError, match="index"):
        pack_sketch(counted({LOWEST_INDEX - 1: 1}))
    with pytest.raises(SketchError, match="alpha"):
        pack_sketch(Sketch(alpha=0.05))


def test_a_damaged_stored_document_is_refused_without_building_anything_large():
    document = stored(pack_sketch(sketch_of([0.1, 0.2])))
    too_long = base64.b64encode(zlib.compress(bytes(8 * 5000))).decode()
    odd = base64.b64encode(zlib.compress(bytes(12))).decode()
    for broken in (
        {**document, "alpha": 0.05},
        {**document, "packed": "not base64 of zlib"},
        {**document, "packed": too_long},  # more fields than bins up to HIGHEST_INDEX
        {**document, "packed": odd},  # not a whole number of fields
        {**document, "start": 10**7},
        {**document, "start": 1.9},
        {**document, "count": 1e999},
        {**document, "count": 2**60},
        {key: value for key, value in document.items() if key != "start"},
    ):
        total = SketchSum()
        with pytest.raises(SketchError):
            total.add(broken)
        assert total.count == 0 and total.sketch().bins == {}


def test_a_row_stored_with_pairs_out_of_range_still_merges():
    # Polls before packing stored any whole index: such a bin counts in the nearest one kept.
    old = {**Sketch().document(), "count": 3, "bins": [[HIGHEST_INDEX + 5, 1], [-230, 2]]}
    total = SketchSum()
    total.add(stored(old))
    total.add(stored(pack_sketch(counted({-230: 1}))))
    assert total.sketch().bins == {-230: 3, HIGHEST_INDEX: 1}


def test_rows_add_up_counts_stacks_and_the_five_slowest():
    rows = []
    for n in range(3):
        sketches = {name: pack_sketch(sketch_of([0.01 * (n + 1)] * 10)) for name in SKETCHES}
        slow = {
            "count": 1,
            "stacks": {"main;a": 1.0, f"main;b{n}": 0.5},
            "slowest": [{"id": n * 10 + i, "duration": n + i / 10} for i in range(4)],
        }
        rows.append(
            {"count": 10, "errors": n, "sketches": json.dumps(sketches), "slow": json.dumps(slow)}
        )
    figures = RequestFigures()
    for row in rows:
        figures.add(row)
    figures.add(None)
    broken = {**rows[0], "sketches": rows[0]["sketches"].replace('"start"', '"begin"')}
    with pytest.raises(SketchError):
        figures.add(broken)  # and nothing of it is added:
    assert (figures.count, figures.errors, figures.slow_count) == (30, 3, 3)
    assert figures.stacks == {"main;a": 3.0, "main;b0": 0.5, "main;b1": 0.5, "main;b2": 0.5}
    assert [r["duration"] for r in figures.slowest] == [2.3, 2.2, 2.1, 2.0, 1.3]
    assert figures.sketch("latency").count == 30
    again = RequestFigures().add(figures.row(max_stacks=2))
    assert again.stacks == {"main;a": 3.0, "[other]": 1.5}
    assert again.sketch("total").bins == figures.sketch("total").bins
