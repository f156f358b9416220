"""The middleware in this process: request-start headers, routes and their bounds, errors,
labels, and what a request's time covers."""

import asyncio
import contextlib
import gc
import http.client
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from mwhelpers import ENGINES, counted

import sampler
import sampler.middleware
from sampler import _requests
from sampler._labels import native_route_tags
from sampler._requests import MAX_RAW_PATHS, OVERFLOW, UNMATCHED, queue_delay, recorder
from sampler.middleware._wsgi import PythonWSGIMiddleware

# Counting, naming and labelling requests; the tests that read a request's time or count its
# samples are alone.
pytestmark = pytest.mark.parallel

NOW = 1_795_000_000.25

# The WSGI middleware's two paths: in C where the native extension is built (what
# WSGIMiddleware is then), and the Python one it falls back on.
WSGI_PATHS = ["python"] + (["c"] if native_route_tags() is not None else [])


@pytest.fixture(params=WSGI_PATHS)
def wsgi_middleware(request):
    return {"c": sampler.middleware.WSGIMiddleware, "python": PythonWSGIMiddleware}[request.param]


def document_counting(expected):
    """The recorder's document once it counts ``expected`` requests (a server closes an
    answer's body, which ends its timing, just after sending it)."""
    deadline = time.monotonic() + 10
    while True:
        document = recorder.document()
        if counted([document]) >= expected or time.monotonic() > deadline:
            return document
        time.sleep(0.02)


@pytest.mark.parametrize(
    "header, expected",
    [
        (f"t={NOW - 0.1:.3f}", 0.1),  # nginx: seconds with ms
        (f"t={int((NOW - 0.1) * 1e3)}", 0.1),  # Heroku: ms
        (f"t={int((NOW - 0.1) * 1e6)}", 0.1),  # New Relic: us
        (f"t={int((NOW - 0.1) * 1e9)}", 0.1),  # ns
        (f"{int((NOW - 0.25) * 1e3)}", 0.25),  # a bare number
        (f" t={NOW - 2:.6f} ", 2.0),
        (f"t={int((NOW - 0.5) * 1e6)} D=1234", 0.5),  # Apache's mod_headers: %t %D
        (f"t={NOW - 0.5:.3f}, D=1234", 0.5),
        (f"t={NOW + 0.002:.3f}", 0.0),  # the proxy's clock ahead: counted as no wait
    ],
)
def test_request_start_headers_in_every_unit(header, expected):
    assert queue_delay(header, NOW) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_proxy_clock_ahead_never_makes_the_total_shorter_than_the_latency(path, monkeypatch):
    from sampler import _request_routes
    from sampler._request_routes import Route

    if path == "python":
        monkeypatch.setattr(_request_routes, "_native", None)
    elif _request_routes._native is None:
        pytest.skip("the native extension is not built")
    ahead = f"t={NOW + 0.3:.3f}"  # the proxy's clock 0.3 s ahead; each request takes 0.2 s
    route = Route()
    route.add_batch([("/r", 0.0, 0.2, ahead, NOW, 1, False, "200 OK", "/r")] * 5)
    assert route.queue.count == route.queue.zero == 5
    assert route.total.sum == pytest.approx(route.latency.sum) == pytest.approx(1.0)
    assert route.total.zero == 0


@pytest.mark.parametrize("header", ["", "t=", "t=abc", "t=-5", "t=nan", f"t={NOW - 7200:.0f}"])
def test_what_is_not_a_request_start_is_ignored(header):
    assert queue_delay(header, NOW) is None


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Serving:
    """A WSGI app served on 127.0.0.1 by wsgiref, in a thread of this process."""

    def __init__(self, app):
        self.server = make_server("127.0.0.1", 0, app, WSGIServer, Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, name="wsgi-worker")
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def get(self, path, headers=None):
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read()

    def close(self):
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()


def plain_app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/raise":
        raise RuntimeError("planted")
    if path == "/stream":

        def chunks():
            for _ in range(3):
                time.sleep(0.05)
                yield b"chunk"

        start_response("200 OK", [("Content-Type", "text/plain")])
        return chunks()
    if path == "/broken":  # the answer breaks off: its status was sent, its body never ends

        def broken():
            yield b"chunk"
            raise RuntimeError("the database went away mid-stream")

        start_response("200 OK", [("Content-Type", "text/plain")])
        return broken()
    status = "500 Internal Server Error" if path == "/error" else "200 OK"
    start_response(status, [("Content-Type", "text/plain")])
    return [b"ok"]


def test_a_plain_wsgi_app_counts_by_path_up_to_a_bound_then_overflows(wsgi_middleware):
    serving = Serving(wsgi_middleware(plain_app))
    try:
        for i in range(MAX_RAW_PATHS + 10):
            assert serving.get(f"/page/{i}?q=1")[0] == 200
        assert serving.get("/page/0")[0] == 200
    finally:
        serving.close()
    routes = document_counting(MAX_RAW_PATHS + 11)["routes"]
    assert len(routes) == MAX_RAW_PATHS + 1
    assert routes["/page/0"]["count"] == 2
    assert routes[OVERFLOW]["count"] == 10
    assert "/page/0?q=1" not in routes  # the query string is not part of a route


@pytest.mark.alone
def test_errors_exceptions_and_streamed_bodies(wsgi_middleware):
    serving = Serving(wsgi_middleware(plain_app))
    try:
        assert serving.get("/error")[0] == 500
        assert serving.get("/raise")[0] == 500  # wsgiref answers the exception
        assert serving.get("/stream") == (200, b"chunk" * 3)
        with contextlib.suppress(http.client.HTTPException, OSError):
            serving.get("/broken")  # the client sees a 200 cut short
    finally:
        serving.close()
    routes = document_counting(4)["routes"]
    assert routes["/error"]["errors"] == 1 and routes["/raise"]["errors"] == 1
    assert routes["/stream"]["errors"] == 0
    assert routes["/broken"]["errors"] == 1  # it counted as a success before
    # The body is timed until the server closes it: three 50 ms chunks.
    assert routes["/stream"]["latency"]["sum"] >= 0.15


def test_a_body_the_server_stops_reading_is_closed_once(wsgi_middleware):
    # PEP 3333: close() once. A client gone after the first chunk: the server stops reading
    # and closes the answer (gunicorn: for item in body: write(item) ... finally: close()).
    class Body:
        closes = 0

        def __iter__(self):
            return self

        def __next__(self):
            return b"chunk"

        def close(self):
            Body.closes += 1

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()

    answer = wsgi_middleware(app)({"PATH_INFO": "/gone", "REQUEST_METHOD": "GET"}, lambda *a: None)
    try:
        for _chunk in answer:
            break  # the write failed
    finally:
        answer.close()
    del answer
    gc.collect()
    assert Body.closes == 1  # the Python path's generator closed it a second time


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def make_flask_app(middleware=sampler.middleware.WSGIMiddleware):
    import flask

    app = flask.Flask("flaskapp")

    @app.route("/items/<int:item_id>")
    def item(item_id):
        spin(0.3)
        return {"item": item_id}

    app.wsgi_app = middleware(app.wsgi_app)
    return app


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.alone
def test_flask_requests_are_named_by_their_rule_and_label_their_samples(engine, wsgi_middleware):
    # The python engine's thread driver: this main thread waits on a socket meanwhile.
    driver = "thread" if engine == "python" else "auto"
    s = sampler.start(port="none", engine=engine, driver=driver)
    serving = Serving(make_flask_app(wsgi_middleware))
    try:
        header = {"X-Request-Start": f"t={time.time() - 0.25:.3f}"}
        assert serving.get("/items/7", header)[0] == 200
        assert serving.get("/missing")[0] == 404
        document = document_counting(2)
        profile = s.profile()
    finally:
        serving.close()
        sampler.stop()
    routes = document["routes"]
    assert set(routes) == {"/items/<int:item_id>", UNMATCHED}
    item = routes["/items/<int:item_id>"]
    assert item["count"] == 1 and item["queue"]["count"] == 1
    assert 0.24 <= item["queue"]["sum"] <= 0.5
    labelled = {"route": "/items/<int:item_id>"}
    index = profile["label_sets"].index(labelled)
    in_view = sum(c for i, stack, c in profile["stacks"] if i == index and ".item;" in stack)
    assert in_view >= 15
    assert not [stack for i, stack, _ in profile["stacks"] if i != index and ".item;" in stack]
    if engine == "native":
        (slowest,) = item["slowest"]
        assert any(".item;" in stack for stack in slowest["stacks"])
    else:
        assert document["stacks"] is None


def test_starlette_routes_are_named_by_template_through_mounts():
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def user(request):
        return PlainTextResponse(sampler.current_labels()["route"])

    app = Starlette(routes=[Mount("/api", routes=[Route("/users/{user_id}", user)])])
    app.add_middleware(sampler.middleware.ASGIMiddleware)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = await client.get("/api/users/1")
            await client.get("/api/users/2")
            missing = await client.get("/nowhere")
        return first, missing

    first, missing = asyncio.run(main())
    assert first.text == "/api/users/{user_id}"  # the handler runs under the route's label
    assert missing.status_code == 404
    routes = document_counting(3)["routes"]
    assert routes["/api/users/{user_id}"]["count"] == 2
    assert routes[UNMATCHED]["count"] == 1


def test_the_recorder_thread_goes_when_idle(monkeypatch):
    monkeypatch.setattr(_requests, "IDLE_EXIT", 0.5)
    serving = Serving(sampler.middleware.WSGIMiddleware(plain_app))
    try:
        serving.get("/a")
        document_counting(1)
        assert [t for t in threading.enumerate() if t.name == "fleetflame-requests"]
    finally:
        serving.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        t.name == "fleetflame-requests" for t in threading.enumerate()
    ):
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "fleetflame-requests"]
    assert recorder.document()["routes"]["/a"]["count"] == 1


def test_the_p99_estimate_follows_the_latest_requests():
    from sampler._requests import WINDOW, Route

    route = Route()
    assert route.p99 is None
    for _ in range(99):
        route.add(0.001, None, 200)
    assert route.p99 is None  # too few to say
    route.add(0.001, None, 200)
    assert route.p99 == pytest.approx(0.001, rel=0.01)
    for _ in range(2 * WINDOW):
        route.add(0.1, None, 200)  # the route became slow
    assert route.p99 == pytest.approx(0.1, rel=0.01)
    for i in range(2 * WINDOW):
        route.add(0.001 if i % 100 else 0.5, None, 200)  # fast again, 1% at 500 ms
    # The last 5,000 to 10,000 requests only: the slow period is forgotten.
    assert route.p99 == pytest.approx(0.001, rel=0.01)
    assert route.latency.count == 2 * WINDOW + 100 + 2 * WINDOW


def test_a_batch_keeps_only_its_slowest_requests(monkeypatch):
    # A first batch after a quiet spell: a thousand requests, none kept before. Only the five
    # slowest become the route's slowest; stacks are looked up for them and for the slowest
    # 1% (slower than the p99 known so far), no others.
    from sampler._request_routes import TOP

    recorder.reset()
    looked_up = []
    original = recorder._add_stacks
    monkeypatch.setattr(
        recorder, "_add_stacks", lambda wanted: (looked_up.extend(wanted), original(wanted))
    )
    now = time.monotonic()
    recorder.pending.extend(
        ("/r", now, 0.001 * ((i * 37) % 1000), None, 0.0, 1, False, 200, "/r") for i in range(1000)
    )
    recorder.process()
    route = recorder.routes["/r"]
    assert sorted(r.duration for r in route.slowest) == pytest.approx(
        [0.995, 0.996, 0.997, 0.998, 0.999]
    )
    assert sum(top for *_, top in looked_up) == TOP
    assert all(slow or top for *_, slow, top in looked_up)
    assert len(looked_up) < 30, len(looked_up)
    recorder.reset()


@pytest.mark.parametrize("path", ["python"] + (["c"] if "c" in WSGI_PATHS else []))
def test_a_new_routes_first_batch_hands_back_few_candidates(path, monkeypatch):
    # With fewer than TOP slowest kept, every request used to be handed back as one that may
    # be among them (its queueing delay read in Python too): only each chunk's TOP slowest
    # can be, besides those slower than the p99 (~1%).
    from sampler import _request_routes
    from sampler._request_routes import REFRESH, TOP, Route

    if path == "python":
        monkeypatch.setattr(_request_routes, "_native", None)
    requests = [
        ("/r", 0.0, 0.001 * ((i * 37) % 1000), "t=1.0", 2.0, 1, False, 200, "/r")
        for i in range(1000)
    ]
    candidates = Route().add_batch(requests)
    slow = sum(was_slow for _, was_slow in candidates)
    assert len(candidates) <= TOP * (len(requests) // REFRESH) + slow, len(candidates)
    assert 0 < slow < 20
    slowest = sorted(request[2] for request, _ in candidates)[-TOP:]
    assert slowest == pytest.approx([0.995, 0.996, 0.997, 0.998, 0.999])


class Body:
    """An app's body that can be seen going: a weak reference dies with it."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.closed = False

    def __iter__(self):
        return iter(self.chunks)

    def close(self):
        self.closed = True


def call_wsgi(app, environ):
    statuses = []
    body = app(environ, lambda status, headers, exc_info=None: statuses.append(status))
    chunks = list(body)
    body.close()
    return statuses, chunks


def test_a_request_leaves_no_cycle_behind(wsgi_middleware):
    # The environ holds the request for the routing hook, the request its environ and body:
    # once closed, both are freed at once, not by a later collection (a Flask request's
    # objects would otherwise wait in the collector's generations).
    import gc
    import weakref

    bodies = []

    def app(environ, start_response):
        start_response("200 OK", [])
        body = Body([b"ok"])
        body.environ = environ  # as a framework's response may hold its request
        bodies.append(weakref.ref(body))
        return body

    wrapped = wsgi_middleware(app)
    gc.disable()
    try:
        assert call_wsgi(wrapped, {"PATH_INFO": "/a"}) == (["200 OK"], [b"ok"])
        assert bodies[0]() is None
    finally:
        gc.enable()
    recorder.stop()
    assert recorder.routes["/a"].count == 1


def test_tags_of_the_caller_come_back_after_the_request(wsgi_middleware):
    # The C path tags its caller's frame (it has none of its own): a tag the caller had open
    # on that frame is in force again after the request, and inside it the route merges with
    # it.
    from sampler import _labels

    seen = {}

    def app(environ, start_response):
        seen["labels"] = _labels.current_labels()
        start_response("200 OK", [])
        return [b"ok"]

    wrapped = wsgi_middleware(app)
    with sampler.tag(tenant="t1"):
        before = dict(_labels.frame_tags)
        call_wsgi(wrapped, {"PATH_INFO": "/b"})
        assert _labels.current_labels() == {"tenant": "t1"}
        assert _labels.frame_tags == before
    assert seen["labels"] == {"tenant": "t1", "route": "/b"}
    assert _labels.current_labels() == {}


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
def test_a_call_from_c_with_no_python_frame_takes_the_python_path():
    # uWSGI and mod_wsgi call the app from C: no Python frame to tag, so the Python path does
    # it, on a frame of its own. A thread started by _thread runs its function with none.
    import _thread

    from sampler import _labels

    seen = {}

    def app(environ, start_response):
        seen["labels"] = _labels.current_labels()
        seen["request"] = type(environ["fleetflame.request"]).__name__
        start_response("200 OK", [])
        return [b"ok"]

    wrapped = sampler.middleware.WSGIMiddleware(app)
    started = []
    _thread.start_new_thread(wrapped, ({"PATH_INFO": "/from-c"}, lambda *a: started.append(a)))
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == [("200 OK", [], None)]
    assert seen == {"labels": {"route": "/from-c"}, "request": "_Request"}


@pytest.mark.parametrize("path", ["python"] + (["c"] if "c" in WSGI_PATHS else []))
def test_a_batch_counts_as_its_requests_one_by_one(path, monkeypatch):
    # The recorder counts a route's requests a batch at a time (in C where the native
    # extension is built), judging each against the p99 of its time (refreshed every REFRESH
    # requests) as counting them singly would.
    import random

    from sampler import _request_routes
    from sampler._request_routes import Route

    if path == "python":
        monkeypatch.setattr(_request_routes, "_native", None)

    rng = random.Random(7)
    finished = []
    for _ in range(1234):
        elapsed = rng.choice([0.001, 0.002, 0.05]) * rng.uniform(0.5, 1.5)
        header = rng.choice(
            [None, "", f"t={NOW - 0.01:.6f}", "t=abc", f" t={NOW - 0.02:.3f}, D=5", "1e3", "t=1_0"]
            + [f"{(NOW - 0.03) * 1000:.0f}", f"t={NOW - 7200:.0f}", "t=-5", "t=nan", "t=."]
            + [f"t={NOW + 0.5:.3f}"]  # a clock ahead: a negative delay
        )
        status = rng.choice(
            ["200 OK", "503 Unavailable", 0, 404, " 50", "5xx", True, "404", 10**30, -(10**30)]
        )
        finished.append(("/r", 0.0, elapsed, header, NOW, 1, False, status, "/r"))
    single, batched = Route(), Route()
    slow_singly = []
    for request in finished:
        _, _, elapsed, header, wall, _, _, status, _ = request
        slow_singly.append(single.p99 is not None and elapsed > single.p99)
        queue = queue_delay(header, wall) if header else None
        single.add(elapsed, queue, _requests.status_code(status))
    candidates = batched.add_batch(finished[:500]) + batched.add_batch(finished[500:])
    assert single.errors > 0 and single.queue.count > 0 and single.queue.zero > 0
    for name in ("count", "errors", "p99"):
        assert getattr(batched, name) == getattr(single, name)
    for name in ("latency", "queue", "total"):
        one, other = getattr(batched, name), getattr(single, name)
        assert (one.bins, one.count, one.zero, one.max) == (
            other.bins,
            other.count,
            other.zero,
            other.max,
        )
        assert one.sum == pytest.approx(other.sum)
    assert batched.slow_count == sum(slow_singly) > 0
    slow = [
        id(request) for request, was_slow in zip(finished, slow_singly, strict=True) if was_slow
    ]
    assert [id(request) for request, was_slow in candidates if was_slow] == slow


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
def test_flask_routing_is_seen_without_a_before_request_hook(caplog):
    # The C path names a Flask request as Flask matches its rule (its request class sees
    # url_rule set), so Flask has no hook to call; outside a request nothing changes.
    import flask

    app = make_flask_app()
    assert app.before_request_funcs == {}
    assert issubclass(app.request_class, flask.Request)
    with app.test_request_context("/items/3"):
        assert flask.request.url_rule.rule == "/items/<int:item_id>"
    environ = {"PATH_INFO": "/items/4", "REQUEST_METHOD": "GET", "SERVER_NAME": "localhost"}
    environ.update({"SERVER_PORT": "80", "wsgi.url_scheme": "http"})
    seen = {}

    @app.route("/labels")
    def labels():
        from sampler import _labels

        seen["labels"] = _labels.current_labels()
        return "ok"

    statuses, _ = call_wsgi(app, dict(environ, PATH_INFO="/labels"))
    assert statuses == ["200 OK"] and seen["labels"] == {"route": "/labels"}
    assert call_wsgi(app, dict(environ, PATH_INFO="/nowhere"))[0] == ["404 NOT FOUND"]
    recorder.stop()
    assert set(recorder.routes) == {"/labels", UNMATCHED}
    assert not [r for r in caplog.records if "did not say" in r.getMessage()]


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
def test_a_request_class_replaced_after_wrapping_falls_back_to_a_hook(caplog):
    # Flask no longer tells the wrapper: the first request counts unmatched and says why once,
    # then a before_request hook names the requests.
    import flask

    app = make_flask_app()

    @app.route("/b")
    def b():
        return "ok"

    class Mine(flask.Request):
        pass

    app.request_class = Mine
    environ = {"REQUEST_METHOD": "GET", "SERVER_NAME": "localhost", "SERVER_PORT": "80"}
    environ["wsgi.url_scheme"] = "http"
    for _ in range(3):
        assert call_wsgi(app, dict(environ, PATH_INFO="/b"))[0] == ["200 OK"]
    recorder.stop()
    assert recorder.routes[UNMATCHED].count == 1 and recorder.routes["/b"].count == 2
    assert len([r for r in caplog.records if "did not say" in r.getMessage()]) == 1


class Falsy:
    """An environ value whose truth cannot be told."""

    def __bool__(self):
        raise ValueError("no truth here")


def test_environ_values_that_raise_leave_no_tag_open(wsgi_middleware):
    # A header or a path whose truth raises: the call raises that, and the labels in force and
    # the tagged frames are as they were.
    from sampler import _labels

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]

    wrapped = wsgi_middleware(app)
    before = dict(_labels.frame_tags)
    for environ in ({"PATH_INFO": Falsy()}, {"PATH_INFO": "/a", "HTTP_X_REQUEST_START": Falsy()}):
        with pytest.raises(ValueError, match="no truth"):
            call_wsgi(wrapped, environ)
        assert _labels.frame_tags == before and _labels.current_labels() == {}
    assert call_wsgi(wrapped, {"PATH_INFO": "/a"}) == (["200 OK"], [b"ok"])


def test_a_late_routing_call_names_the_request_and_tags_nothing(wsgi_middleware):
    from sampler import _labels

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]

    wrapped = wsgi_middleware(app)
    environ = {"PATH_INFO": "/a"}
    body = wrapped(environ, lambda *a: None)
    environ["fleetflame.request"].routed("/late")  # after the app returned
    list(body)
    body.close()
    assert _labels.current_labels() == {} and id(sys._getframe()) not in _labels.frame_tags
    recorder.stop()
    assert "/late" in recorder.routes


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
def test_a_wrapper_never_initialised_says_so():
    from sampler import _native

    wrapper = _native.WSGIWrapper.__new__(_native.WSGIWrapper)
    with pytest.raises(RuntimeError, match="not initialised"):
        wrapper({"PATH_INFO": "/"}, lambda *a: None)


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
def test_c_reads_a_request_start_header_to_the_same_double_as_float():
    # The C count reads most headers by a short cut (digits as one integer over a power of
    # ten, both exact), the rest as float() does: each delay must be float()'s to the bit.
    import random

    from sampler._request_routes import Route

    rng = random.Random(11)
    headers = ["t=5.", "t=.5", "t=0001795000000.5", "t=1795000000.123456789012", "1795000000"]
    for _ in range(3000):
        integer = str(rng.randrange(1, 10 ** rng.randint(1, 19)))
        fraction = str(rng.randrange(10 ** rng.randint(1, 25))).zfill(rng.randint(1, 25))
        number = rng.choice([integer, f"{integer}.{fraction}", f"0.{fraction}", f"00{integer}"])
        headers.append(rng.choice(["t=", ""]) + number)
    for header in headers:
        # Half a second after the header's time in its unit: an exact delay only if both read
        # the same number (a last-bit difference in seconds since the epoch is ~2e-7 s).
        value = float(header.removeprefix("t="))
        scale = next((s for s in (1, 1e3, 1e6, 1e9) if value < 1e11 * s), 1e9)
        wall = value / scale + 0.5
        route = Route()
        route.add_batch([("/r", 0.0, 0.001, header, wall, 1, False, "200 OK", "/r")])
        expected = queue_delay(header, wall)
        assert (route.queue.max if route.queue.count else None) == expected, header


# Functions named for where a greenlet's request spends its time, found in its stacks.
def spin_in_the_body(seconds):
    spin(seconds)


def spin_in_slow(seconds):
    spin(seconds)


def spin_in_other(seconds):
    spin(seconds)


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
@pytest.mark.alone
def test_a_streamed_body_keeps_its_stacks_under_green_threads(wsgi_middleware):
    # Under gevent's patch a slow request's stacks are its route's samples in its time: the
    # body's work (a streamed answer, iterated by the server after the app returned) must
    # carry the route too, or such a request has no stacks at all (it had its OS thread's).
    greenlet = pytest.importorskip("greenlet")

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body():
            for _ in range(3):
                spin_in_the_body(0.1)
                yield b"chunk"

        return body()

    sampler.start(port="none")
    try:
        # Served on a greenlet, as gevent's server does (its hub the parent).
        middleware = wsgi_middleware(app)
        served = greenlet.greenlet(lambda: call_wsgi(middleware, {"PATH_INFO": "/stream"}))
        statuses, chunks = served.switch()
        assert statuses == ["200 OK"] and len(chunks) == 3
        document = document_counting(1)
    finally:
        sampler.stop()
    (slowest,) = document["routes"]["/stream"]["slowest"]
    assert any("spin_in_the_body" in stack for stack in slowest["stacks"]), slowest["stacks"]


@pytest.mark.skipif("c" not in WSGI_PATHS, reason="the native extension is not built")
@pytest.mark.alone
def test_greenlets_taking_turns_without_a_thread_patch_keep_their_own_stacks(wsgi_middleware):
    # gevent's WSGIServer with patch_all(thread=False), or uWSGI's gevent loop: requests take
    # turns on one OS thread though threading is not patched. A slow request's stacks must be
    # its own, not the other route's served meanwhile.
    greenlet = pytest.importorskip("greenlet")
    hub = greenlet.getcurrent()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        work = spin_in_slow if environ["PATH_INFO"] == "/slow" else spin_in_other
        for _ in range(10 if environ["PATH_INFO"] == "/slow" else 1):
            work(0.02)
            hub.switch()
        return [b"ok"]

    middleware = wsgi_middleware(app)
    slow = greenlet.greenlet(lambda: call_wsgi(middleware, {"PATH_INFO": "/slow"}))

    def others():
        while True:
            call_wsgi(middleware, {"PATH_INFO": "/other"})

    other = greenlet.greenlet(others)
    sampler.start(port="none")
    try:
        while not slow.dead:
            slow.switch()
            other.switch()
        document = document_counting(2)
    finally:
        sampler.stop()
        other.throw(greenlet.GreenletExit)
    (slowest,) = document["routes"]["/slow"]["slowest"]
    assert any("spin_in_slow" in stack for stack in slowest["stacks"]), slowest["stacks"]
    assert not any("spin_in_other" in stack for stack in slowest["stacks"]), slowest["stacks"]


@pytest.mark.parametrize("on_a_greenlet", [False, True])
def test_a_django_request_on_a_greenlet_is_found_by_its_route(on_a_greenlet, monkeypatch):
    # As the WSGI middleware's: requests taking turns on one OS thread are found by route.
    greenlet = pytest.importorskip("greenlet")
    from sampler.middleware.django import Middleware

    class Request:
        META: dict = {}
        path = "/items/1"

    class Response:
        status_code = 200

    finished = []
    monkeypatch.setattr(recorder, "finish", finished.append)
    middleware = Middleware(lambda request: Response())
    if on_a_greenlet:
        greenlet.greenlet(lambda: middleware(Request())).switch()
    else:
        middleware(Request())
    ((*_, by_label, status, path),) = finished
    assert (by_label, status, path) == (on_a_greenlet, 200, "/items/1")


GREENLET_LOADED_LATE = """
import sys
sys.path.insert(0, sys.argv[1])
import sampler.middleware
from sampler._requests import recorder

finished = []
recorder.finish = finished.append


def app(environ, start_response):
    start_response("200 OK", [])
    return [b"ok"]


middleware = sampler.middleware.{name}(app)


def call():
    body = middleware({{"PATH_INFO": "/r"}}, lambda *args: None)
    list(body)
    body.close()


call()  # greenlet not loaded yet: looked for at each request, not remembered as absent
assert "greenlet" not in sys.modules
import greenlet

greenlet.greenlet(call).switch()
call()
print([request[6] for request in finished])
"""


@pytest.mark.parametrize("path", WSGI_PATHS)
def test_greenlet_loaded_after_the_first_request_is_still_seen(path):
    # gevent is often imported by a worker after the app module (a server's own hooks): the
    # middleware must find greenlets from then on, not keep that it found no greenlet module.
    pytest.importorskip("greenlet")
    name = {"c": "WSGIMiddleware", "python": "_wsgi.PythonWSGIMiddleware"}[path]
    script = GREENLET_LOADED_LATE.format(name=name)
    root = str(Path(sampler.__file__).resolve().parents[1])
    run = subprocess.run(
        [sys.executable, "-c", script, root], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[False,", "True,", "False]"]


def quick_recorder_app(path, monkeypatch):
    """An app wrapped by the middleware of ``path``, its recorder's thread counting every
    10 ms, and a request's environ."""
    monkeypatch.setattr(_requests, "PERIOD", 0.01)
    app = {"c": sampler.middleware.WSGIMiddleware, "python": PythonWSGIMiddleware}[path]
    return app(plain_app), {"PATH_INFO": "/a", "REQUEST_METHOD": "GET"}


def twenty_more_requests(wrapped, environ):
    """Twenty requests, then a wait (5 s at most) for the recorder to have taken them."""
    for _ in range(20):
        call_wsgi(wrapped, dict(environ))
    deadline = time.monotonic() + 5
    while recorder.pending and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("path", WSGI_PATHS)
def test_a_recorder_thread_that_could_not_start_is_started_by_a_later_request(path, monkeypatch):
    # A spike of threads (a pids cgroup's limit, memory): the recorder's thread cannot start
    # once. The request is not failed for it, and requests after the spike are counted: the
    # recorder was left "awake" with no thread, and the C middleware, which appends to a
    # non-empty queue without calling finish, kept appending to a queue nothing read.
    wrapped, environ = quick_recorder_app(path, monkeypatch)

    def refuse(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as spike:
        spike.setattr(threading.Thread, "start", refuse)
        call_wsgi(wrapped, dict(environ))  # not failed by the recorder
    twenty_more_requests(wrapped, environ)
    assert not recorder.pending, "requests left waiting for a recorder thread that never came"
    routes = recorder.document()["routes"]
    assert routes["/a"]["count"] + recorder.dropped == 21


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("path", WSGI_PATHS)
def test_requests_are_counted_after_the_recorder_thread_died(path, monkeypatch):
    # The recorder's thread dies of an error outside its batches (its set-up here): it was
    # left "awake" with no thread, and every request after waited in the queue for good.
    wrapped, environ = quick_recorder_app(path, monkeypatch)
    failed = []

    def fail_once():
        if not failed:
            failed.append(True)
            raise RuntimeError("planted")

    monkeypatch.setattr(_requests, "own_thread", fail_once)
    call_wsgi(wrapped, dict(environ))
    deadline = time.monotonic() + 5
    while recorder._awake and time.monotonic() < deadline:
        time.sleep(0.01)
    twenty_more_requests(wrapped, environ)
    assert not recorder.pending, "requests left waiting for a recorder thread that is gone"
    assert recorder.document()["routes"]["/a"]["count"] + recorder.dropped == 21
