"""The ASGI middleware; on a Starlette or FastAPI app it names requests by their route."""

from __future__ import annotations

import sys
import time
from threading import get_ident
from time import monotonic

from .._labels import native_route_tags, route_tag_type
from .._requests import MAX_PENDING, UNMATCHED, recorder

# In C where the native extension is built: a request's tag costs no Python frame.
RouteTag = route_tag_type()
_NATIVE = native_route_tags()

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping
    from typing import Any

    Scope = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Any]]
    Send = Callable[[Any], Awaitable[None]]
    # What names a route's handler: _named, or the native RouteHandle.
    Named = Callable[[Callable[..., Awaitable[None]], str], Callable[..., Any]]

# Where a request's state, [route, status, answered], waits in its scope for the route's
# wrapper (answered: the monotonic time of the answer's last body message, or 0.0).
KEY = "fleetflame.request"
_HEADERS = (b"x-request-start", b"x-queue-start")
# How far down the chain of wrapped apps (``.app``) the router is looked for.
MAX_DEPTH = 32


def python_request_start(headers: Any) -> str | None:
    """The value of the first request-start header of a scope's headers, or None: pairs are
    tuples or lists of two bytes, as servers give them; any other is passed over, as in C."""
    for pair in headers:
        if isinstance(pair, (tuple, list)) and len(pair) == 2:
            name, value = pair
            if isinstance(name, bytes) and name in _HEADERS and isinstance(value, bytes):
                return value.decode("latin-1")
    return None


def _coroutine_marks() -> dict[str, object]:
    """What asyncio (``_is_coroutine``, 3.11) and inspect (3.12 on) look for on a callable
    whose call returns an awaitable: the send we give an app must pass for a coroutine
    function (asgiref's ``AsyncToSync(send)`` warns otherwise) without being one (a coroutine
    of ours a message cost more than the rest of the wrapper)."""
    import asyncio.coroutines
    import inspect

    marks = {"_is_coroutine": getattr(asyncio.coroutines, "_is_coroutine", None)}
    marks["_is_coroutine_marker"] = getattr(inspect, "_is_coroutine_mark", None)
    return {name: mark for name, mark in marks.items() if mark is not None}


class PythonStatusSend:
    """The send a request's app is given: notes the response's status in ``state[1]`` and
    returns the server's send's awaitable; for the answer's last message (a body with no
    more to come, or a pathsend), one that notes in ``state[2]`` when the server has sent it:
    the request's end (an app may run background tasks after it, as Starlette's do). When
    trailers follow the body, ``state[2]`` is None and the app's return ends the request."""

    __slots__ = ("send", "state")

    def __init__(self, send: Send, state: list[Any]) -> None:
        self.send = send
        self.state = state

    def __call__(self, message: Any) -> Awaitable[None]:
        kind = message.get("type")
        if kind == "http.response.start":
            self.state[1] = message.get("status", 0)
            if message.get("trailers"):
                self.state[2] = None
        elif self.state[2] is not None and (
            kind == "http.response.pathsend"
            or (kind == "http.response.body" and not message.get("more_body", False))
        ):
            return _answered(self.send(message), self.state)
        return self.send(message)


async def _answered(sending: Awaitable[Any], state: list[Any]) -> Any:
    """Awaits the server's send of the answer's last message, then notes the request's end
    (a send that raises leaves it unanswered: a failure); gives what the send gave. The C path
    (sampler/_native_src/asgi.c) does the same for a send that gives a coroutine."""
    sent = await sending
    state[2] = monotonic()
    return sent


def _named(handle: Callable[..., Awaitable[None]], template: str) -> Callable[..., Any]:
    """Wraps a route's handler: the request gets the route's name and its samples the label."""

    async def named(scope: Scope, receive: Receive, send: Send) -> None:
        name = recorder.names.get(template) or recorder.route_name(template)
        state = scope.get(KEY)
        if state is not None:
            state[0] = name
        tag = RouteTag(sys._getframe(0))
        tag.route(name)
        try:
            await handle(scope, receive, send)
        finally:
            tag.close()

    named.fleetflame_route = template  # type: ignore[attr-defined]
    return named


if getattr(_NATIVE, "RouteHandle", None) is None:
    _NATIVE = None  # an extension built before these parts: the Python ones
_marked = False


def _mark_sends() -> None:
    """Marks both sends and the middleware's call as coroutine functions, once: at the first
    ASGI middleware, so that importing ``sampler.middleware`` for a WSGI app does not import
    asyncio."""
    global _marked
    if _marked:
        return
    marks = _coroutine_marks()
    for name, mark in marks.items():
        setattr(PythonStatusSend, name, mark)
        setattr(ASGIMiddleware.__call__, name, mark)  # it gives an awaitable, as one does
    if _NATIVE is not None:
        _NATIVE.asgi_mark(marks)
        _NATIVE.asgi_answered(_answered)
        _NATIVE.asgi_bind(recorder, UNMATCHED, KEY, MAX_PENDING)
    _marked = True


class ASGIMiddleware:
    """Wraps an ASGI app: ``app.add_middleware(ASGIMiddleware)`` or ``ASGIMiddleware(app)``.

    On a Starlette or FastAPI app each route's handler is wrapped, once, so a request is named
    by its route's template (``/items/{item_id}``) and its handler's samples carry it, whatever
    task runs it; any other app's requests by their path, the first ``MAX_RAW_PATHS`` of them.
    """

    # The header's search, the status's send, a routed app's request (all the coroutine below
    # does) and a route's named handler: in C where the native extension is built.
    request_start = staticmethod(
        _NATIVE.asgi_request_start if _NATIVE is not None else python_request_start
    )
    status_send = _NATIVE.StatusSend if _NATIVE is not None else PythonStatusSend
    routed_request = staticmethod(_NATIVE.asgi_request) if _NATIVE is not None else None
    route_handle = _NATIVE.RouteHandle if _NATIVE is not None else staticmethod(_named)

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        _mark_sends()
        self.app = app
        self._routed: bool | None = None  # None: not looked for routes yet
        self._inspectable()

    def _inspectable(self) -> None:
        """Servers tell ASGI 3 from 2 by whether ``app.__call__`` is a coroutine function
        (uvicorn asks asyncio, hypercorn inspect). Ours gives an awaitable and is marked as
        one (_mark_sends), but before 3.12 inspect knows no marker: there an instance's
        ``__call__`` is the Python path's coroutine function, what such a server sees (a
        call of the app itself is the class's, which gives the same request's awaitable,
        in C where it can). Not on a subclass with a ``__call__`` of its own."""
        if sys.version_info < (3, 12) and type(self).__call__ is ASGIMiddleware.__call__:
            self.__call__ = self._request  # type: ignore[method-assign]

    def __getstate__(self) -> dict[str, Any]:
        # A copy's __call__ is its own, not the one bound to the original.
        return {k: v for k, v in self.__dict__.items() if k != "__call__"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._inspectable()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The request's awaitable: an HTTP request's through a routed app is in C where the
        extension is built; any other is the coroutine of ``_request``."""
        if self.routed_request is not None and scope.get("type") == "http":
            if self._routed is None:
                self._routed = _wrap_routes(self.app, self.route_handle)
            if self._routed:
                return self.routed_request(self.app, scope, receive, send)  # type: ignore[no-any-return]
        return self._request(scope, receive, send)

    async def _request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if self._routed is None:
            self._routed = _wrap_routes(self.app, self.route_handle)
        started = monotonic()
        header = self.request_start(scope.get("headers") or ())
        wall = time.time() if header else 0.0
        state: list[Any] = [None, 0, 0.0]
        scope[KEY] = state
        tag = None
        if not self._routed:
            state[0] = recorder.route_name(scope.get("path") or "/", raw=True)
            tag = RouteTag(sys._getframe(0))
            tag.route(state[0])
        try:
            await self.app(scope, receive, self.status_send(send, state))
        except BaseException:
            if not state[2]:  # failed before its answer was sent (after: the client had it)
                state[1] = 0
            raise
        finally:
            if tag is not None:
                tag.close()
            recorder.finish(
                (
                    state[0] or UNMATCHED,
                    started,
                    (state[2] or monotonic()) - started,
                    header,
                    wall,
                    get_ident(),
                    True,
                    state[1],
                    scope.get("path") or "/",
                )
            )


def _wrap_routes(app: Any, named: Named) -> bool:
    """Finds the router under ``app`` (the first object down ``.app`` with a list of
    ``routes``) and wraps its routes' handlers by ``named``; returns whether it found one."""
    for _ in range(MAX_DEPTH):
        routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            _wrap_all(routes, "", named)
            return True
        app = getattr(app, "app", None)
        if app is None:
            return False
    return False


def _wrap_all(routes: list[Any], prefix: str, named: Named) -> None:
    for route in routes:
        path = getattr(route, "path", None)
        handle = getattr(route, "handle", None)
        if not isinstance(path, str) or handle is None:
            continue
        inner = getattr(route, "routes", None)
        if isinstance(inner, list) and inner:  # a Mount of routes: its own are wrapped
            _wrap_all(inner, prefix + path, named)
        elif not getattr(handle, "fleetflame_route", None):
            route.handle = named(handle, prefix + path)


class PythonASGIMiddleware(ASGIMiddleware):
    """The ASGI middleware without the native extension's parts (what an install without the
    extension runs; the tests run both)."""

    request_start = staticmethod(python_request_start)
    status_send = PythonStatusSend
    routed_request = None
    route_handle = staticmethod(_named)
