"""The middleware in real servers under load from a real load generator.

Flask under gunicorn (sync and gthread), FastAPI under uvicorn and Django under gunicorn, each
with a planted slow path (1 request in 50 spends 40 to 78 ms of CPU in ``planted_slow_path``,
in a shuffled order) or the ad server's case (1 request in 200 holds the worker 15 ms). The load
generator times each of its requests from before connecting to the last byte of the answer.

What the server's latency can include: from the moment the app is called to the moment its
answer is closed. What it cannot: connecting, waiting to be accepted, read and parsed (in a
gthread worker whose other threads spin, the thread that accepts waits for the GIL, 5 ms at a
time), and the answer's way back. So the load generator sets X-Request-Start as it sends each
request, as a proxy does, and its p99 is compared with the p99 of the server's ``total`` (the
queueing the header shows plus the latency): what is left out is then the answer's way back
and the client's own wake-up. It never has more requests in flight than the server has workers,
and the p99 falls among the planted 60 ms requests.
"""

import sys

import pytest
from mwhelpers import exact_quantile, gunicorn, has_frame, load, merged_route, uvicorn

from sampler._engine_native import unavailable
from sampler._sketch import Sketch

NATIVE = unavailable() is None
ITEMS = "/items/<int:item_id>"


def planted_plan(count, every=50):
    return [(f"/items/{i}", "slow" if i % every == every // 2 else "") for i in range(count)]


def check_slow_path_and_p99(documents, sent, route, workers, threads=1):
    assert len(documents) == workers
    assert all(s.status == 200 for s in sent)
    sketches, parts = merged_route(documents, route)
    assert sum(part["count"] for part in parts) == len(sent) == sketches["latency"].count
    assert sketches["total"].count == len(sent)
    planted = {s.path for s in sent if s.plant == "slow"}
    # p99: the sketch's, merged over the workers, against the load generator's own.
    truth = exact_quantile([s.latency for s in sent], 0.99)
    # A threaded worker's thread that has sent its answer takes the GIL back before its clock
    # stops (at the body's close): with the other threads busy, up to a switch interval after
    # the client had its last byte (docs/worst-cases.md; seen: 82.9 ms against 78.5, +5.6%).
    gil = sys.getswitchinterval() if threads > 1 else 0.0
    assert truth * 0.95 <= sketches["total"].quantile(0.99) <= truth * 1.05 + gil, truth
    # The app's own latency is within the total, to the two sketches' errors (each quantile
    # within 1% of its value: 1.01 / 0.99 apart at most) and the header's rounding (nginx's
    # form rounds the start to the millisecond: a total up to 0.5 ms short); it failed at 1.1%
    # alone, 60.2 against 59.0 ms. And the total is within the load generator's, to the
    # header's forms (two of three are whole milliseconds, one truncated) and one more: the
    # server's clock stops when it closes the answer, after the client may have read its last
    # byte (a worker descheduled in between, on a loaded machine; failed once at +1.1%+1 ms).
    assert sketches["latency"].quantile(0.99) <= sketches["total"].quantile(0.99) * 1.0203 + 5e-4
    assert sketches["total"].quantile(0.99) <= truth * 1.03 + 0.001 + gil
    # The slowest 1% (slower than the route's p99 estimate when they ended): the planted ones
    # longer than most before them (13 to 21 for these plans, simulated with the estimate's own
    # rule and requests dealt to the workers at random); the planted path is most of what they did.
    assert sum(part["slow"]["count"] for part in parts) >= 6
    if NATIVE:
        slow_stacks = {}
        for part in parts:
            for stack, weight in part["slow"]["stacks"].items():
                slow_stacks[stack] = slow_stacks.get(stack, 0) + weight
        assert has_frame(slow_stacks, "planted_slow_path") > 0.5 * sum(slow_stacks.values())
    for document, part in zip(documents, parts, strict=True):
        slowest = part["slowest"]
        assert len(slowest) == 5
        assert {r["path"] for r in slowest} <= planted, slowest
        assert part["p99"] is not None
        if NATIVE:
            assert document["stacks"] == "native"
            for request in slowest:
                assert has_frame(request["stacks"], "planted_slow_path") > 0, request


@pytest.mark.slow
@pytest.mark.parametrize(
    "worker_class, workers, threads",
    [("sync", 2, 1), ("gthread", 1, 4)],
)
def test_flask_under_gunicorn_slowest_requests_and_p99(worker_class, workers, threads):
    server = gunicorn("flask_app:app", worker_class, workers, threads)
    try:
        sent = load(server.port, planted_plan(1500), workers * threads, header=True)
        documents = server.requests_documents(len(sent))
    finally:
        server.stop()
    check_slow_path_and_p99(documents, sent, ITEMS, workers, threads)


@pytest.mark.slow
def test_fastapi_under_uvicorn_slowest_requests_and_p99():
    server = uvicorn("fastapi_app:app")
    try:
        # One at a time: an event loop reads no request while a handler blocks it, and a
        # request that waits unread is invisible to any timer in the app.
        sent = load(server.port, planted_plan(1000), concurrency=1, header=True)
        documents = server.requests_documents(len(sent))
    finally:
        server.stop()
    check_slow_path_and_p99(documents, sent, "/items/{item_id}", 1)


@pytest.mark.slow
def test_django_under_gunicorn_names_requests_by_url_pattern():
    server = gunicorn("django_app:application", "sync", 1, 1)
    try:
        sent = load(server.port, planted_plan(400), concurrency=1, header=True)
        (document,) = server.requests_documents(len(sent))
    finally:
        server.stop()
    assert all(s.status == 200 for s in sent)
    assert set(document["routes"]) == {ITEMS}
    part = document["routes"][ITEMS]
    assert part["count"] == 400 and part["queue"]["count"] == 400
    planted = {s.path for s in sent if s.plant == "slow"}
    assert {r["path"] for r in part["slowest"]} <= planted
    if NATIVE:
        assert all(has_frame(r["stacks"], "planted_slow_path") > 0 for r in part["slowest"])


def at_least(sketch, value):
    """How many values the sketch holds that are ``value`` or more (to its 1%)."""
    return sum(count for index, count in sketch.bins.items() if sketch.value_of(index) >= value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, route, engine",
    [("flask-sync", "/ads/<int:slot>", "python"), ("fastapi", "/ads/{slot}", "auto")],
)
def test_the_ad_server_queueing_behind_a_request_that_holds_the_worker(kind, route, engine):
    """1 request in 200 holds the worker 15 ms; requests arrive every 4 ms, each with
    X-Request-Start set as it is sent: those that arrive meanwhile wait. Their own latency
    stays short, so the route's p99 latency looks fine; the queueing sketch shows the wait."""
    count, every, holds = 2000, 0.004, 10
    plan = [(f"/ads/{i}", "hold" if i % 200 == 100 else "") for i in range(count)]
    if kind == "flask-sync":
        server = gunicorn("flask_app:app", "sync", 1, 1, engine=engine)
    else:
        server = uvicorn("fastapi_app:app", engine=engine)
    try:
        sent = load(server.port, plan, concurrency=8, every=every, header=True)
        (document,) = server.requests_documents(len(sent))
    finally:
        server.stop()
    assert all(s.status == 200 for s in sent)
    part = document["routes"][route]
    latency = Sketch.from_document(part["latency"])
    queue = Sketch.from_document(part["queue"])
    # Every header was read, whatever its unit (seconds, ms, us).
    assert latency.count == queue.count == count
    assert latency.max >= 0.015  # the holds themselves
    # The route's slowest are kept: with 10 holds of 15 ms, the 5 slowest took 15 ms or more
    # (mostly holds; on a loaded machine a fast request kept off the CPU as long, and on an
    # event loop a request already in the app when a hold starts, count as well).
    assert len(part["slowest"]) == 5
    assert all(r["duration"] >= 0.0148 for r in part["slowest"]), part["slowest"]
    assert at_least(latency, 0.0148) >= holds
    # In-request timers see a fast route: its p99 is not the hold (a fast request is ~0.5 ms;
    # on a loaded machine the 1% slowest stretch to 8-11 ms, still short of the 15 ms)...
    assert latency.quantile(0.99) < 0.012, latency.quantile(0.99)
    # ...while at least the request right behind each hold waited most of it.
    assert at_least(queue, 0.008) >= holds
    # And the load generator, which waited too, agrees that requests were slowed.
    slowed = [s for s in sent if s.latency >= 0.008 and s.plant != "hold"]
    assert len(slowed) >= holds
    if engine == "python":
        assert document["stacks"] is None
