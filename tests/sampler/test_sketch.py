"""The latency sketch: relative error, merging, bounded size, its document."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sampler._sketch import MIN_VALUE, Sketch, SketchError

# Pure arithmetic on given values, no clock: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# Latencies from 1 us to a day, and some zeros (and clock skew's negative queueing delays).
values = st.one_of(
    st.floats(min_value=MIN_VALUE, max_value=86_400.0, allow_nan=False),
    st.sampled_from([0.0, -0.003]),
)
samples = st.lists(values, min_size=1, max_size=400)
alphas = st.sampled_from([0.005, 0.01, 0.02, 0.05])


def exact(sorted_values, q):
    return sorted_values[math.floor(q * (len(sorted_values) - 1))]


def sketch_of(data, alpha=0.01, max_bins=2048):
    sketch = Sketch(alpha, max_bins=max_bins)
    for value in data:
        sketch.add(value)
    return sketch


@settings(max_examples=300, deadline=None)
@given(samples, alphas, st.floats(min_value=0.0, max_value=1.0))
def test_every_quantile_is_within_alpha_of_the_exact_one(data, alpha, q):
    sketch = sketch_of(data, alpha)
    truth = exact(sorted(data), q)
    got = sketch.quantile(q)
    if truth < MIN_VALUE:
        assert got == 0.0
    else:
        assert abs(got - truth) <= alpha * truth * (1 + 1e-9), (got, truth)


@settings(max_examples=200, deadline=None)
@given(samples, samples, st.integers(min_value=1, max_value=40))
def test_merging_gives_the_sketch_of_the_union_even_when_bins_are_folded(a, b, max_bins):
    merged = sketch_of(a, max_bins=max_bins)
    merged.merge(sketch_of(b, max_bins=max_bins))
    union = sketch_of(a + b, max_bins=max_bins)
    assert merged.bins == union.bins
    assert (merged.zero, merged.count, merged.max) == (union.zero, union.count, union.max)
    assert merged.sum == pytest.approx(union.sum)
    # Order does not matter either.
    assert sketch_of(list(reversed(a + b)), max_bins=max_bins).bins == union.bins


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=1e12), min_size=1, max_size=3000))
def test_size_is_bounded_and_the_top_keeps_its_guarantee(data):
    sketch = sketch_of(data, max_bins=64)
    assert len(sketch.bins) <= 64
    assert sketch.count == len(data)
    top = exact(sorted(data), 1.0)
    assert abs(sketch.quantile(1.0) - top) <= 0.01 * top * (1 + 1e-9)


def test_a_million_latencies_take_a_few_hundred_bins():
    sketch = Sketch()
    for i in range(1, 1_000_001):
        sketch.add(i * 1e-5)  # 10 us to 10 s
    assert len(sketch.bins) <= 700
    assert sketch.quantile(0.99) == pytest.approx(9.9, rel=0.01)


@given(samples)
def test_the_document_round_trips_through_json(data):
    sketch = sketch_of(data)
    back = Sketch.from_document(json.loads(json.dumps(sketch.document())))
    assert back.bins == sketch.bins and back.zero == sketch.zero and back.count == sketch.count
    assert back.quantile(0.5) == sketch.quantile(0.5)


def test_bad_documents_and_mismatched_merges_are_refused():
    with pytest.raises(SketchError):
        Sketch.from_document({"alpha": 0.01})
    with pytest.raises(SketchError):
        Sketch.from_document({**Sketch().document(), "bins": [[1, -2]]})
    with pytest.raises(SketchError):
        Sketch(0.01).merge(Sketch(0.02))
    assert Sketch().quantile(0.99) is None


@settings(max_examples=150, deadline=None)
@given(samples, samples, st.floats(min_value=0.0, max_value=1.0))
def test_a_quantile_since_an_earlier_copy_is_that_of_the_values_added_after_it(a, b, q):
    sketch = sketch_of(a)
    mark = sketch.copy()
    for value in b:
        sketch.add(value)
    assert sketch.quantile(q, since=mark) == sketch_of(b).quantile(q)
    assert sketch.quantile(q, since=sketch.copy()) is None


@settings(max_examples=100, deadline=None)
@given(samples, st.integers(min_value=1, max_value=50))
def test_adding_all_at_once_counts_as_adding_one_by_one(data, max_bins):
    one_by_one = sketch_of(data, max_bins=max_bins)
    at_once = Sketch(max_bins=max_bins)
    at_once.add_all(data[: len(data) // 2])
    at_once.add_all(data[len(data) // 2 :])
    assert at_once.bins == one_by_one.bins
    assert (at_once.zero, at_once.count, at_once.max) == (
        one_by_one.zero,
        one_by_one.count,
        one_by_one.max,
    )
    assert at_once.sum == pytest.approx(one_by_one.sum)
