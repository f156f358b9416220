"""Bounded memory: distinct stacks, depth, names and label sets all have caps."""

import gc
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from sampler import _labels
from sampler._settings import resolve
from sampler._stacks import OTHER, TRUNCATED, StackTable

# Memory and counts of stacks, not time: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


def table(**overrides):
    """A table with the sampler's default bounds but for ``overrides``, sampled by hand."""
    return StackTable.from_settings(resolve(overrides, environ={}), mode="wall", interval=1e-9)


def sample_here(t, frame):
    t.sample({threading.get_ident(): frame}, set())


def recurse(depth, then):
    if depth == 0:
        return then(sys._getframe())
    return recurse(depth - 1, then)


def folded(t):
    return {t.folded(key): count for key, count in t.counts.items()}


def test_deep_stacks_keep_their_leaf_frames_under_a_marker():
    t = table(max_depth=20)
    recurse(100, lambda frame: sample_here(t, frame))
    (stack,) = folded(t)
    frames = stack.split(";")
    assert frames[0] == TRUNCATED and len(frames) == 21
    assert frames[-1] == "test_bounds:recurse"


def test_distinct_stacks_past_the_cap_fold_into_other():
    t = table(max_stacks=10)
    for depth in range(30):
        recurse(depth, lambda frame: sample_here(t, frame))
    assert len(t.counts) == 11
    assert any(stack == OTHER for stack in folded(t))
    assert abs(sum(t.counts.values()) - t.total) < 1e-6  # nothing lost, only folded


def make_function(i):
    namespace = {}
    exec(f"def generated_{i}(then):\n    return then(__import__('sys')._getframe())", namespace)
    return namespace[f"generated_{i}"]


def test_memory_stays_flat_with_endless_new_code(monkeypatch):
    # Code generated at run time (templates, exec) must not grow the sampler without bound.
    from sampler import _stacks

    monkeypatch.setattr(_stacks, "MAX_NAMES", 2_000)
    monkeypatch.setattr(_stacks, "_MAX_CODE_CACHE", 1_000)
    t = table(max_stacks=500)

    def churn(start, count):
        for i in range(start, start + count):
            make_function(i)(lambda frame: sample_here(t, frame))

    churn(0, 5_000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    churn(5_000, 20_000)
    gc.collect()
    # What the sampler's own code allocated: other tests' threads may still be winding down.
    mine = [tracemalloc.Filter(True, f"{Path(_stacks.__file__).parent}/*")]
    after = tracemalloc.take_snapshot().filter_traces(mine)
    grown = sum(stat.size_diff for stat in after.compare_to(before.filter_traces(mine), "filename"))
    tracemalloc.stop()
    assert len(t.names) <= 2_000 and len(t.counts) <= 501
    assert grown < 2_000_000, f"grew by {grown} bytes over 20,000 new functions"


def test_label_sets_are_capped(monkeypatch):
    monkeypatch.setattr(_labels, "MAX_LABEL_SETS", _labels.label_set_count() + 5)
    ids = set()
    for i in range(50):
        with _labels.tag(request_id=str(i)):
            ids.add(_labels.frame_tags[id(sys._getframe())])
    assert len(ids) <= 6
    assert _labels.label_set(max(ids)) == dict(_labels.OVERFLOW)
