"""The ASGI middleware in this process, on both its paths (the native extension's header search
and status send, and the Python ones it falls back on): what a request's record holds."""

import asyncio
import contextlib
import time

import pytest
from mwhelpers import counted

import sampler.middleware
from sampler._labels import native_route_tags
from sampler._requests import UNMATCHED, recorder
from sampler.middleware._asgi import KEY, PythonASGIMiddleware

# Counting and naming requests only: nothing here reads a request's time.
pytestmark = pytest.mark.parallel


class PathRouter:
    """A router as the middleware finds one (a list of routes) naming each request by its
    path, as a Starlette route's wrapper names it by its template: the C path's requests
    through a routed app (sampler._native.ASGIRequest), on the tests' plain apps."""

    routes: list = []

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        state = scope.get(KEY)
        if state is not None:
            state[0] = recorder.route_name(scope["path"])
        await self.app(scope, receive, send)


class RoutedASGIMiddleware(sampler.middleware.ASGIMiddleware):
    def __init__(self, app):
        super().__init__(PathRouter(app))


MIDDLEWARES = {"python": PythonASGIMiddleware}
if native_route_tags() is not None:
    MIDDLEWARES.update(c=sampler.middleware.ASGIMiddleware, routed=RoutedASGIMiddleware)


@pytest.fixture(params=list(MIDDLEWARES))
def asgi_middleware(request):
    """The Python path, the C path on an app without routes (its Python coroutine, with the C
    header search and send) and the C path on a routed app (all of it in C)."""
    return MIDDLEWARES[request.param]


def test_importing_the_middleware_for_a_wsgi_app_imports_no_asyncio():
    import subprocess
    import sys

    code = "import sys, sampler.middleware; print('asyncio' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_extensions_parts_are_used_where_it_is_built():
    from sampler.middleware._asgi import PythonStatusSend, python_request_start

    native = native_route_tags() is not None
    middleware = sampler.middleware.ASGIMiddleware
    assert (middleware.request_start is python_request_start) is not native
    assert (middleware.status_send is PythonStatusSend) is not native


def test_a_routed_apps_request_is_in_c_and_the_app_passes_for_asgi_3(asgi_middleware):
    # Servers tell ASGI 3 from 2 by asking whether app.__call__ is a coroutine function:
    # uvicorn with asyncio's test, hypercorn with inspect's (which before 3.12 sees no
    # marker). The C path's __call__ is a plain function giving an awaitable.
    import inspect

    from uvicorn.config import Config

    app = asgi_middleware(plain_app)
    assert inspect.iscoroutinefunction(app.__call__)
    assert asyncio.iscoroutinefunction(app.__call__)
    config = Config(app)
    config.load()
    assert config.interface == "asgi3"
    scope = {"type": "http", "path": "/", "headers": []}
    request = app(scope, None, None)
    native = asgi_middleware is RoutedASGIMiddleware
    assert (type(request).__name__ == "Awaiting") is native
    request.close()


def test_the_send_an_app_is_given_passes_for_a_coroutine_function(asgi_middleware):
    # asgiref's AsyncToSync(send) (Django's and Channels' sync code, WsgiToAsgi) warns, or
    # under -W error fails the request, when the send is not marked as one.
    import asyncio
    import warnings

    from asgiref.sync import AsyncToSync

    async def send(message):
        return None

    middleware = asgi_middleware(plain_app)  # the first marks the sends
    status_send = middleware.status_send(send, [None, 0, 0.0])
    assert asyncio.iscoroutinefunction(status_send)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AsyncToSync(status_send)


def test_a_send_by_keyword_or_of_another_mapping_notes_the_status(asgi_middleware):
    import asyncio
    import collections

    sent = []

    async def send(message):
        sent.append(message)

    state = [None, 0, 0.0]
    status_send = asgi_middleware.status_send(send, state)
    asyncio.run(status_send(message={"type": "http.response.start", "status": 204}))
    assert state[1] == 204
    chained = collections.ChainMap({"type": "http.response.start", "status": None})
    asyncio.run(status_send(chained))
    assert state[1] is None and len(sent) == 2
    asyncio.run(status_send({"type": "http.response.body", "body": b"a", "more_body": True}))
    assert state[2] == 0.0  # more to come: not answered yet
    before = time.monotonic()
    asyncio.run(status_send(message={"type": "http.response.body", "body": b"b"}))
    assert before <= state[2] <= time.monotonic()


async def background_app(scope, receive, send):
    """Answers at once, then works on, as Starlette's background tasks do; /late-fail raises
    after its answer is out."""
    await send({"type": "http.response.start", "status": 201})
    await send({"type": "http.response.body", "body": b"ok"})
    await asyncio.sleep(0.3)
    if scope["path"] == "/late-fail":
        raise RuntimeError("planted")


def test_an_answer_ends_when_the_server_has_sent_it_and_a_failed_send_is_a_failure(
    asgi_middleware,
):
    async def app(scope, receive, send):
        trailers = scope["path"] == "/trailers"
        await send({"type": "http.response.start", "status": 200, "trailers": trailers})
        if scope["path"] == "/file":
            await send({"type": "http.response.pathsend", "path": "/etc/hostname"})
        else:
            await send({"type": "http.response.body", "body": b"ok"})
        if trailers:  # the answer ends with them: the app's return is the request's end
            await send({"type": "http.response.trailers", "headers": [], "more_trailers": False})
        await asyncio.sleep(0.3)  # after the answer: not the request's time

    async def run(path, send):
        scope = {"type": "http", "path": path, "headers": [], "method": "GET"}

        async def receive():
            return {"type": "http.request", "body": b""}

        with contextlib.suppress(ConnectionResetError):
            await asgi_middleware(app)(scope, receive, send)

    async def slow_send(message):
        await asyncio.sleep(0.15 if message["type"] != "http.response.start" else 0)

    async def gone(message):  # the client left: the last send fails after 0.15 s
        await slow_send(message)
        if message["type"] != "http.response.start":
            raise ConnectionResetError("the client went away")

    asyncio.run(run("/sent", slow_send))
    asyncio.run(run("/file", slow_send))
    asyncio.run(run("/gone", gone))
    asyncio.run(run("/trailers", slow_send))
    routes = records(4)
    (request,) = routes["/trailers"]["slowest"]
    assert request["duration"] >= 0.3 and request["status"] == 200
    for route in ("/sent", "/file"):
        (request,) = routes[route]["slowest"]
        assert 0.15 <= request["duration"] < 0.3 and request["status"] == 200
    (request,) = routes["/gone"]["slowest"]
    assert request["status"] == 0 and routes["/gone"]["errors"] == 1


def test_the_last_messages_send_is_awaited_as_the_servers_would_be(asgi_middleware):
    # The C path awaits a coroutine send by an object of its own: asyncio must take it as
    # it took the server's coroutine (a task of it, a cancellation, a wait_for), and a send
    # giving another awaitable (a future) must work too.
    last = {"type": "http.response.body", "body": b"ok"}
    asgi_middleware(plain_app)  # marks the sends

    async def slow(message):
        await asyncio.sleep(0.05)
        return "sent"

    async def shielded(message):  # catches its cancellation, and sends anyway
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)

    async def main():
        state = [None, 0, 0.0]
        assert await asyncio.create_task(asgi_middleware.status_send(slow, state)(last)) == "sent"
        assert state[2] > 0
        for send, answered in ((slow, False), (shielded, True)):
            state = [None, 0, 0.0]
            task = asyncio.create_task(asgi_middleware.status_send(send, state)(last))
            await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert (state[2] > 0) is answered, send
        state = [None, 0, 0.0]
        await asyncio.wait_for(asgi_middleware.status_send(slow, state)(last), 1)
        assert state[2] > 0

        def future_send(message):
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
            return future

        state = [None, 0, 0.0]
        await asgi_middleware.status_send(future_send, state)(last)
        assert state[2] > 0

    asyncio.run(main())


def test_a_request_cancelled_closed_or_dropped_is_recorded_as_a_coroutine_would_be(
    asgi_middleware,
):
    # The C path's request is an object, not a coroutine: cancelled, closed or dropped
    # mid-way, it must end as the Python path's coroutine does (its finally), once.
    import gc

    scope = {"type": "http", "headers": [], "method": "GET"}

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        return None

    async def answers_late(scope, receive, send):
        if scope["path"] == "/cancelled-waiting":
            await asyncio.sleep(1)
        await background_app(scope, receive, send)

    async def main():
        app = asgi_middleware(answers_late)
        before = asyncio.create_task(app({**scope, "path": "/cancelled-waiting"}, receive, send))
        after = asyncio.create_task(app({**scope, "path": "/cancelled-answered"}, receive, send))
        await asyncio.sleep(0.05)  # both wait: /cancelled-answered after its answer
        for task in (before, after):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        async def waits(scope, receive, send):
            await asyncio.sleep(1)

        for path in ("/closed", "/dropped", "/never-begun"):
            request = asgi_middleware(waits)({**scope, "path": path}, receive, send)
            if path != "/never-begun":
                request.send(None)  # its first step: waiting in the app
            if path != "/dropped":
                request.close()
                request.close()  # once is enough
            del request
            gc.collect()

        def not_async(scope, receive, send):
            raise TypeError("planted")

        with pytest.raises(TypeError, match="planted"):
            await asgi_middleware(not_async)({**scope, "path": "/sync-fail"}, receive, send)

    asyncio.run(main())
    routes = records(5)
    assert "/never-begun" not in routes  # an unstarted coroutine runs no finally
    for route in ("/cancelled-waiting", "/closed", "/dropped", "/sync-fail"):
        assert [request["status"] for request in routes[route]["slowest"]] == [0], route
    (answered,) = routes["/cancelled-answered"]["slowest"]
    assert answered["status"] == 201 and answered["duration"] < 0.05


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_odd_uses_of_a_request_go_as_they_go_with_a_coroutine(asgi_middleware):
    # Found by a review of the C path: each of these went otherwise there, one crashed.
    import copy
    import types

    scope = {"type": "http", "headers": [], "method": "GET"}
    called = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        return None

    async def answers(scope, receive, send):
        called.append(scope["path"])
        if scope["path"] == "/close-inside":
            with pytest.raises(ValueError, match="already executing"):
                scope["request"].close()
        if scope["path"] == "/clears-state":
            scope[KEY].clear()  # the Python path fails at its end; the C path must not crash
        if scope["path"] == "/twice":
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})
        return "not None"

    def plain_generator(scope, receive, send):
        yield None

    @types.coroutine
    def old_style(scope, receive, send):  # a generator-based coroutine: await takes it
        yield from send({"type": "http.response.start", "status": 200}).__await__()
        yield from send({"type": "http.response.body", "body": b"ok"}).__await__()

    async def main():
        app = asgi_middleware(answers)
        made = app({**scope, "path": "/made-only"}, receive, send)
        assert called == []  # nothing runs until it is awaited
        made.close()
        assert await app({**scope, "path": "/returns"}, receive, send) is None
        inside = {**scope, "path": "/close-inside"}
        inside["request"] = app(inside, receive, send)
        await inside["request"]
        with contextlib.suppress(IndexError):
            await app({**scope, "path": "/clears-state"}, receive, send)
        twice = app({**scope, "path": "/twice"}, receive, send)
        first = asyncio.ensure_future(twice)
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="being awaited already"):
            await twice
        await first
        with pytest.raises(TypeError, match="can't be used in 'await' expression"):
            await asgi_middleware(plain_generator)({**scope, "path": "/generator"}, receive, send)
        await asgi_middleware(old_style)({**scope, "path": "/old-style"}, receive, send)
        copied = copy.copy(app)
        assert copied.__call__.__self__ is copied  # not the original's

    asyncio.run(main())
    routes = records(4)
    assert "/made-only" not in routes
    for route in ("/returns", "/close-inside", "/twice", "/old-style"):
        assert [request["status"] for request in routes[route]["slowest"]] == [200], route
    assert [request["status"] for request in routes["/generator"]["slowest"]] == [0]


def test_a_request_ends_with_its_answer_not_with_its_background_work(asgi_middleware):
    app = asgi_middleware(background_app)
    call(app, "/later")
    call(app, "/late-fail")
    routes = records(2)
    for route in ("/later", "/late-fail"):
        (request,) = routes[route]["slowest"]
        assert request["duration"] < 0.2, request  # was the 0.3 s of work after the answer
        assert request["status"] == 201  # the client had its answer, whatever came after


async def plain_app(scope, receive, send):
    """Not Starlette: requests named by their path. /fail raises, /teapot answers 418."""
    if scope["path"] == "/fail":
        raise RuntimeError("planted")
    await send(
        {"type": "http.response.start", "status": 418 if scope["path"] == "/teapot" else 200}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def call(app, path, headers=()):
    scope = {"type": "http", "path": path, "headers": headers, "method": "GET"}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    async def main():
        try:
            await app(scope, receive, send)
        except RuntimeError:
            sent.append("raised")

    asyncio.run(main())
    return sent


def records(expected):
    deadline = time.monotonic() + 10
    while True:
        recorder.process()
        document = recorder.document()
        if counted([document]) >= expected or time.monotonic() > deadline:
            return document["routes"]
        time.sleep(0.02)


def test_statuses_errors_and_what_the_app_sends_pass_through(asgi_middleware):
    app = asgi_middleware(plain_app)
    assert [m["type"] for m in call(app, "/teapot")] == [
        "http.response.start",
        "http.response.body",
    ]
    assert call(app, "/fail") == ["raised"]
    routes = records(2)
    (teapot,) = routes["/teapot"]["slowest"]
    assert teapot["status"] == 418 and routes["/teapot"]["errors"] == 0
    (failed,) = routes["/fail"]["slowest"]
    assert failed["status"] == 0 and routes["/fail"]["errors"] == 1


@pytest.mark.parametrize(
    "headers, queued",
    [
        pytest.param([(b"host", b"x"), (b"x-request-start", b"t=%.3f")], True, id="tuples"),
        pytest.param([[b"x-queue-start", b"t=%.3f"]], True, id="lists"),
        pytest.param([(b"X-Request-Start", b"t=%.3f")], False, id="not lower case"),
        pytest.param([(b"x-request-start",)], False, id="a pair of one"),
        pytest.param([(b"x-request-start", "t=%.3f")], False, id="a value not bytes"),
        pytest.param((), False, id="none"),
    ],
)
def test_the_request_start_header_of_any_shape_gives_the_queueing(asgi_middleware, headers, queued):
    start = time.time() - 0.25

    def fill(value):
        planted = value if isinstance(value, bytes) else value.encode()
        return value % start if b"%" in planted else value

    filled = [type(pair)(fill(value) for value in pair) for pair in headers]
    call(asgi_middleware(plain_app), "/a", filled)
    (route,) = records(1).values()
    assert route["queue"]["count"] == (1 if queued else 0)
    if queued:
        assert 0.24 <= route["queue"]["sum"] <= 1.0


def test_a_request_outside_http_is_passed_on_uncounted(asgi_middleware):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    async def main():
        await asgi_middleware(app)({"type": "lifespan"}, None, None)

    asyncio.run(main())
    assert seen == ["lifespan"]
    recorder.process()
    assert recorder.document()["routes"] == {}


@pytest.mark.parametrize("asgi_middleware", [MIDDLEWARES["python"], MIDDLEWARES.get("c")])
def test_starlette_routes_are_named_on_both_paths(asgi_middleware):
    if asgi_middleware is None:
        pytest.skip("the native extension is not built")
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def user(request):
        return PlainTextResponse(sampler.current_labels()["route"], status_code=201)

    app = Starlette(routes=[Route("/users/{user_id}", user)])
    app.add_middleware(asgi_middleware)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/users/1"), await client.get("/nowhere")

    found, missing = asyncio.run(main())
    assert found.status_code == 201 and found.text == "/users/{user_id}"
    assert missing.status_code == 404
    routes = records(2)
    assert routes["/users/{user_id}"]["slowest"][0]["status"] == 201
    assert routes[UNMATCHED]["slowest"][0]["status"] == 404


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("path", ["c", "python"])
def test_a_routes_samples_carry_its_label_on_each_path(engine, path):
    # The C path labels the samples under the handler's caller's frame, the Python path's
    # wrapper under its own: both must label all of the handler's, nested tags merged in.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sampler._engine_native import unavailable

    if (engine == "native" or path == "c") and unavailable() is not None:
        pytest.skip(str(unavailable()))
    root = Path(__file__).resolve().parents[2]
    script = Path(__file__).parent / "apps" / "routed_labels.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, str(script), engine, path],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    document = json.loads(done.stdout)
    found = {}
    for index, stack, count in document["stacks"]:
        leaf = next((name for name in (":report;", ":export;") if name in stack), None)
        if leaf is not None and stack.endswith(":spin"):
            labels = tuple(sorted(document["label_sets"][index].items()))
            found.setdefault(leaf, {}).setdefault(labels, 0)
            found[leaf][labels] += count
    assert set(found[":report;"]) == {(("route", "/reports/{day}"),)}, found
    assert set(found[":export;"]) == {(("phase", "write"), ("route", "/export"))}, found
    assert sum(found[":report;"].values()) >= 20 and sum(found[":export;"].values()) >= 20


@pytest.mark.parametrize("asgi_middleware", [MIDDLEWARES["python"], MIDDLEWARES.get("c")])
def test_a_route_whose_handler_gives_another_awaitable_is_named_and_labelled(asgi_middleware):
    # The C path labels a handler coroutine's frame; a handler that gives another awaitable
    # has none, and its route must still be in the labels in force (it was not).
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    if asgi_middleware is None:
        pytest.skip("the native extension is not built")
    seen = []

    class NotACoroutine:
        def __init__(self, inner):
            self.inner = inner

        def __await__(self):
            seen.append(sampler.current_labels().get("route"))
            return self.inner.__await__()

    class WrappedRoute(Route):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            handle = self.handle
            self.handle = lambda scope, receive, send: NotACoroutine(handle(scope, receive, send))

    async def item(request):
        seen.append(sampler.current_labels().get("route"))
        return PlainTextResponse("ok")

    app = Starlette(routes=[WrappedRoute("/items/{n}", item)])
    app.add_middleware(asgi_middleware)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/items/1")

    assert asyncio.run(main()).status_code == 200
    assert seen == ["/items/{n}", "/items/{n}"]
    assert records(1)["/items/{n}"]["slowest"][0]["status"] == 200


@pytest.mark.parametrize("path", ["python", "c"])
def test_requests_ended_by_the_interpreters_exit_let_it_exit(path):
    # Requests suspended mid-way when the program ends: their finalizers end them during the
    # interpreter's teardown, where starting the recorder's thread waited for ever (a hang).
    import os
    import subprocess
    import sys
    from pathlib import Path

    if path == "c" and native_route_tags() is None:
        pytest.skip("the native extension is not built")
    code = (
        "import sys\n"
        "import sampler.middleware\n"
        "from sampler.middleware._asgi import PythonASGIMiddleware\n"
        "from starlette.applications import Starlette\n"
        "from starlette.responses import PlainTextResponse\n"
        "from starlette.routing import Route\n"
        "class Suspend:\n"
        "    def __await__(self):\n"
        "        yield None\n"
        "async def slow(request):\n"
        "    await Suspend()\n"
        "    return PlainTextResponse('late')\n"
        "middleware = {'c': sampler.middleware.ASGIMiddleware, 'python': PythonASGIMiddleware}\n"
        "app = middleware[sys.argv[1]](Starlette(routes=[Route('/slow', slow)]))\n"
        "async def receive():\n"
        "    return {'type': 'http.request', 'body': b''}\n"
        "async def send(message):\n"
        "    pass\n"
        "scope = {'type': 'http', 'path': '/slow', 'headers': [], 'method': 'GET',\n"
        "         'query_string': b'', 'root_path': ''}\n"
        "held = []\n"
        "for _ in range(20):\n"
        "    request = app(dict(scope), receive, send)\n"
        "    request.send(None)\n"
        "    held.append(request)\n"
        "cycle = {'held': held}\n"
        "cycle['self'] = cycle\n"
        "print('exiting')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=30, env=env
    )
    assert (done.returncode, done.stdout) == (0, "exiting\n"), done.stderr
