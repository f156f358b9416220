"""Labels from sampler.tag / sampler.tagged travel with their samples into /profile.json."""

import json

import pytest
from samplerhelpers import ENGINES, WORKLOADS, run_python

import sampler


@pytest.fixture(scope="module", params=ENGINES)
def doc(request):
    return json.loads(run_python(str(WORKLOADS / "labelled.py"), request.param).stdout)


def samples_by_labels(doc, leaf, ends=""):
    found = {}
    for index, stack, count in doc["stacks"]:
        if leaf in stack and stack.endswith(ends):
            key = tuple(sorted(doc["label_sets"][index].items()))
            found[key] = found.get(key, 0) + count
    return found


def test_with_block_and_nested_tags_merge(doc):
    found = samples_by_labels(doc, ":upload;")
    assert found.get((("route", "/upload"),), 0) >= 25
    assert found.get((("phase", "store"), ("route", "/upload")), 0) >= 25


def test_tagged_function(doc):
    found = samples_by_labels(doc, ":download;")
    assert found.get((("route", "/download"),), 0) >= 25
    assert sum(found.values()) == found[(("route", "/download"),)]


def test_asyncio_tasks_keep_their_own_labels(doc):
    # The work inside each task's tag (a tick may land in the task before its tag is open, as
    # it runs sampler.tag itself: that sample has no label, rightly).
    tasks = samples_by_labels(doc, ":task;", ends=":spin")
    assert tasks.get((("task", "a"),), 0) >= 10 and tasks.get((("task", "b"),), 0) >= 10
    assert set(tasks) <= {(("task", "a"),), (("task", "b"),)}
    coro = samples_by_labels(doc, ":tagged_coroutine;")
    assert set(coro) == {(("job", "tagged-coroutine"),)}


def test_untagged_samples_have_the_empty_label_set(doc):
    assert doc["label_sets"][0] == {}
    assert any(
        i == 0 and stack.endswith(":spin") and "<module>" in stack for i, stack, _ in doc["stacks"]
    )


@pytest.mark.parallel
def test_tag_contexts_restore_in_process():
    assert sampler.current_labels() == {}
    with sampler.tag(a="1"):
        with sampler.tag(b="2"):
            assert sampler.current_labels() == {"a": "1", "b": "2"}
        assert sampler.current_labels() == {"a": "1"}
    assert sampler.current_labels() == {}
