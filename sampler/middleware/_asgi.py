"""The ASGI middleware; on a Starlette or FastAPI app it names requests by their route."""

from __future__ import annotations

import sys
import threading
import time

from .._labels import route_tag_type
from .._requests import UNMATCHED, recorder

# In C where the native extension is built: a request's tag costs no Python frame.
RouteTag = route_tag_type()

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping
    from typing import Any

    Scope = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Any]]
    Send = Callable[[Any], Awaitable[None]]

# Where a request's state, [route, status], waits in its scope for the route's wrapper.
KEY = "fleetflame.request"
_HEADERS = (b"x-request-start", b"x-queue-start")
# How far down the chain of wrapped apps (``.app``) the router is looked for.
MAX_DEPTH = 32


class ASGIMiddleware:
    """Wraps an ASGI app: ``app.add_middleware(ASGIMiddleware)`` or ``ASGIMiddleware(app)``.

    On a Starlette or FastAPI app each route's handler is wrapped, once, so a request is named
    by its route's template (``/items/{item_id}``) and its handler's samples carry it, whatever
    task runs it; any other app's requests by their path, the first ``MAX_RAW_PATHS`` of them.
    """

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self._routed: bool | None = None  # None: not looked for routes yet

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if self._routed is None:
            self._routed = _wrap_routes(self.app)
        started = time.monotonic()
        header = None
        for name, value in scope.get("headers") or ():
            if name in _HEADERS:
                header = value.decode("latin-1")
                break
        wall = time.time() if header else 0.0
        state: list[Any] = [None, 0]
        scope[KEY] = state
        tag = None
        if not self._routed:
            state[0] = recorder.route_name(scope.get("path") or "/", raw=True)
            tag = RouteTag(sys._getframe(0))
            tag.route(state[0])

        async def send_status(message: Any) -> None:
            if message.get("type") == "http.response.start":
                state[1] = message.get("status", 0)
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException:
            state[1] = 0
            raise
        finally:
            if tag is not None:
                tag.close()
            elapsed = time.monotonic() - started
            recorder.finish(
                (
                    state[0] or UNMATCHED,
                    started,
                    elapsed,
                    header,
                    wall,
                    threading.get_ident(),
                    True,
                    state[1],
                    scope.get("path") or "/",
                )
            )


def _wrap_routes(app: Any) -> bool:
    """Finds the router under ``app`` (the first object down ``.app`` with a list of
    ``routes``) and wraps its routes; returns whether it found one."""
    for _ in range(MAX_DEPTH):
        routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            _wrap_all(routes, "")
            return True
        app = getattr(app, "app", None)
        if app is None:
            return False
    return False


def _wrap_all(routes: list[Any], prefix: str) -> None:
    for route in routes:
        path = getattr(route, "path", None)
        handle = getattr(route, "handle", None)
        if not isinstance(path, str) or handle is None:
            continue
        inner = getattr(route, "routes", None)
        if isinstance(inner, list) and inner:  # a Mount of routes: its own are wrapped
            _wrap_all(inner, prefix + path)
        elif not getattr(handle, "fleetflame_route", None):
            route.handle = _named(handle, prefix + path)


def _named(handle: Callable[..., Awaitable[None]], template: str) -> Callable[..., Any]:
    """Wraps a route's handler: the request gets the route's name and its samples the label."""

    async def named(scope: Scope, receive: Receive, send: Send) -> None:
        name = recorder.route_name(template)
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
