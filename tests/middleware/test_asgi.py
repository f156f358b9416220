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
from sampler.middleware._asgi import PythonASGIMiddleware

# Counting and naming requests only: nothing here reads a request's time.
pytestmark = pytest.mark.parallel

ASGI_PATHS = ["python"] + (["c"] if native_route_tags() is not None else [])


@pytest.fixture(params=ASGI_PATHS)
def asgi_middleware(request):
    return {"c": sampler.middleware.ASGIMiddleware, "python": PythonASGIMiddleware}[request.param]


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


def test_starlette_routes_are_named_on_both_paths(asgi_middleware):
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
