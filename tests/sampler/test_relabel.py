"""An open tag's labels changed in place (a request's route, known once routed)."""

import contextlib
import contextvars
import sys
import threading
import time

import pytest
from samplerhelpers import ENGINES

import sampler
from sampler import _labels


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def before_routing():
    spin(0.3)


def after_routing():
    spin(0.3)


def in_nested_tag():
    spin(0.3)


def after_exit():
    spin(0.2)


def labels_by_leaf(doc):
    found = {}
    for index, stack, count in doc["stacks"]:
        frames = [frame.rsplit(":", 1)[-1] for frame in stack.split(";")]
        if frames[-1] != "spin" or len(frames) < 2:
            continue
        leaf = frames[-2]  # the function that called spin
        labels = tuple(sorted(doc["label_sets"][index].items()))
        found.setdefault(leaf, {}).setdefault(labels, 0)
        found[leaf][labels] += count
    return found


def profile_of(engine, work):
    """The profile of ``work()``. The native engine drains its samples later: holding the
    sampler's lock keeps its drain waiting until every label in ``work`` has changed and
    closed, so the spans must say which samples came before the change. The python engine
    counts as it samples."""
    s = sampler.start(port="none", engine=engine)
    try:
        with s._lock if engine == "native" else contextlib.nullcontext():
            work()
        return s.profile()
    finally:
        sampler.stop()


@pytest.mark.parametrize("engine", ENGINES)
def test_samples_keep_the_labels_in_force_when_they_were_taken(engine):
    set_ids = []

    def work():
        request = sampler.tag(service_tier="web")
        with request:
            before_routing()
            set_ids.append(request.relabel(route="/users/<id>"))
            assert sampler.current_labels() == {"service_tier": "web", "route": "/users/<id>"}
            after_routing()
            with sampler.tag(phase="db"):
                in_nested_tag()
        assert sampler.current_labels() == {}
        after_exit()

    doc = profile_of(engine, work)
    found = labels_by_leaf(doc)
    web = (("service_tier", "web"),)
    routed = (("route", "/users/<id>"), ("service_tier", "web"))
    assert set(found["before_routing"]) == {web}, found["before_routing"]
    assert set(found["after_routing"]) == {routed}, found["after_routing"]
    assert set(found["in_nested_tag"]) == {(("phase", "db"), *routed)}
    assert set(found["after_exit"]) == {()}
    for leaf in ("before_routing", "after_routing", "in_nested_tag"):
        assert sum(found[leaf].values()) >= 15, (leaf, found[leaf])
    assert {"route": "/users/<id>", "service_tier": "web"} in doc["label_sets"]
    assert isinstance(set_ids[0], int) and set_ids[0] > 0


def routed_later(route, before=before_routing, after=after_routing):
    # As the middleware does: the tag is readied on this frame, opened once the route is known.
    request = sampler.tag()
    request.enter_later(sys._getframe(0))
    try:
        before()
        if route is not None:
            request.relabel(route=route)
            after()
    finally:
        request.__exit__()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tag_readied_for_later_is_opened_by_its_relabel_only(engine):
    def work():
        with sampler.tag(service_tier="web"):
            routed_later("/users/<id>")
            assert sampler.current_labels() == {"service_tier": "web"}
            routed_later(None)  # never routed: nothing opened, nothing to close
            assert sampler.current_labels() == {"service_tier": "web"}

    doc = profile_of(engine, work)
    found = labels_by_leaf(doc)
    web = (("service_tier", "web"),)
    assert set(found["before_routing"]) == {web}, found["before_routing"]
    assert set(found["after_routing"]) == {(("route", "/users/<id>"), *web)}
    assert not _labels.frame_tags


def nothing():
    pass


def native_stats(s):
    return s.engine._native.stats()


@pytest.mark.parallel
def test_the_native_table_holds_only_the_tags_open_now():
    # A request's frame is freed and its memory reused by the next request's: 50,000
    # requests leave nothing behind in the table the signal handler reads.
    s = sampler.start(port="none", engine="native")
    try:
        with sampler.tag(outer="yes"):
            for _ in range(50_000):
                routed_later("/fast", nothing, nothing)
            stats = native_stats(s)
            assert (stats["tags_open"], stats["tags_lost"]) == (1, 0), stats
        assert native_stats(s)["tags_open"] == 0
    finally:
        sampler.stop()


def test_thousands_of_tags_open_at_once_all_label_their_samples():
    # Suspended coroutines, each inside its own tag and run in its own context as asyncio
    # runs tasks (an asyncio server with many connections): the table grows past its first
    # size while the handler reads it, and every tag counts.
    def request(number):
        with sampler.tag(conn=str(number % 7)):
            yield
            spin(0.0002)
            yield

    s = sampler.start(port="none", engine="native", interval=0.001)
    try:
        requests = [(request(n), contextvars.copy_context()) for n in range(5000)]
        for r, context in requests:
            context.run(next, r)
        assert native_stats(s)["tags_open"] == 5000
        for r, context in requests:
            context.run(next, r)
        stats = native_stats(s)
        for r, context in requests:
            context.run(r.close)  # each tag closes as its generator exits
        assert native_stats(s)["tags_open"] == 0
        doc = s.profile()
    finally:
        sampler.stop()
    assert stats["tags_lost"] == 0, stats
    in_requests = labelled = 0
    for index, stack, count in doc["stacks"]:
        if stack.endswith("<locals>.request;test_relabel:spin"):
            in_requests += count
            labelled += count * ("conn" in doc["label_sets"][index])
    assert in_requests >= 500, in_requests
    assert labelled == in_requests, (labelled, in_requests)


def test_a_stopped_engine_leaves_no_tags_and_a_new_one_sees_the_open_ones():
    with sampler.tag(kept="yes"):
        s = sampler.start(port="none", engine="native")
        try:
            assert native_stats(s)["tags_open"] == 1  # opened before the engine started
            before_routing()
            doc = s.profile()
        finally:
            sampler.stop()
        assert native_stats(s)["tags_open"] == 0
    found = labels_by_leaf(doc)
    assert set(found["before_routing"]) == {(("kept", "yes"),)}, found


def test_a_start_during_a_stop_waits_for_it_and_samples_with_its_tags():
    old = sampler.start(port="none", engine="native")
    engine_stop = old.engine.stop

    def slow_stop():
        time.sleep(0.3)
        engine_stop()

    old.engine.stop = slow_stop
    stopper = threading.Thread(target=sampler.stop)
    stopper.start()
    time.sleep(0.1)
    new = sampler.start(port="none", engine="native")  # while the old one stops
    stopper.join()
    try:
        assert new is not old and sampler.running() is new
        with sampler.tag(after="restart"):
            assert native_stats(new)["tags_open"] == 1
            before_routing()
        doc = new.profile()
    finally:
        sampler.stop()
    found = labels_by_leaf(doc)
    assert set(found["before_routing"]) == {(("after", "restart"),)}, found
    assert sum(found["before_routing"].values()) >= 15
