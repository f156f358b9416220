"""The WSGI middleware; on a Flask app it also names requests by their URL rule."""

from __future__ import annotations

import sys
import threading
import time

from .._labels import _Tag
from .._requests import UNMATCHED, recorder

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

# Where a request's state waits in its environ for the framework's routing hook.
KEY = "fleetflame.request"


class _Request:
    """One request in flight: its tag, its route once known, its status line."""

    __slots__ = ("tag", "route", "status")

    def __init__(self, tag: _Tag, route: str | None) -> None:
        self.tag = tag
        self.route = route
        self.status: str | int = 0

    def routed(self, template: str) -> None:
        """Names the request after its route template, from now on (its samples too)."""
        self.route = recorder.route_name(template)
        self.tag.relabel(route=self.route)


class WSGIMiddleware:
    """Wraps a WSGI app: ``app.wsgi_app = WSGIMiddleware(app.wsgi_app)``.

    Given a Flask app's ``wsgi_app`` (or the app), requests are named by their URL rule
    (``/users/<int:id>``); any other app's by their path, the first ``MAX_RAW_PATHS`` of them.
    """

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        owner: Any = getattr(app, "__self__", app)
        # Flask, by what it has: routing happens inside it, so a hook says which rule matched.
        self._routed = callable(getattr(owner, "before_request", None)) and hasattr(
            owner, "url_map"
        )
        if self._routed:
            owner.before_request(_flask_routed)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        started = time.monotonic()
        header = environ.get("HTTP_X_REQUEST_START") or environ.get("HTTP_X_QUEUE_START")
        wall = time.time() if header else 0.0
        if self._routed:
            request = _Request(_Tag({}), None)
            request.tag.enter_later(sys._getframe(0))  # opened once routed
        else:
            route = recorder.route_name(environ.get("PATH_INFO") or "/", raw=True)
            request = _Request(_Tag({"route": route}), route)
            request.tag.enter(sys._getframe(0))
        environ[KEY] = request

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            request.status = status
            return start_response(status, headers, exc_info)

        try:
            body = self.app(environ, start)
        except BaseException:
            request.status = 0
            _finish(request, started, header, wall, environ, self._routed)
            raise
        finally:
            request.tag.__exit__()
        wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(wrapper, type) and isinstance(body, wrapper):
            # Left as is, so the server can still send the file its own way (sendfile).
            _finish(request, started, header, wall, environ, self._routed)
            return body  # type: ignore[return-value]
        return _Body(body, request, started, header, wall, environ, self._routed)


class _Body:
    """The app's response body, passed through; the request is timed until it is closed."""

    __slots__ = ("_body", "_finish")

    def __init__(self, body: Iterable[bytes], *finish: Any) -> None:
        self._body = body
        self._finish = finish

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            _finish(*self._finish)


def _finish(
    request: _Request,
    started: float,
    header: str | None,
    wall: float,
    environ: dict[str, Any],
    routed: bool,
) -> None:
    elapsed = time.monotonic() - started
    route = request.route or (UNMATCHED if routed else "/")
    path = environ.get("PATH_INFO") or "/"
    ident = threading.get_ident()
    recorder.finish((route, started, elapsed, header, wall, ident, False, request.status, path))


def _flask_routed() -> None:
    # A before_request function: Flask has matched the URL rule (or failed to) by now. The
    # request context's variable directly (Flask 2.2+): its proxies cost ~2 us a look-up.
    variable = getattr(sys.modules["flask"].globals, "_cv_request", None)
    context = variable.get(None) if variable is not None else None
    flask_request = context.request if context is not None else sys.modules["flask"].request
    request = flask_request.environ.get(KEY)
    if request is not None and request.route is None:
        rule = flask_request.url_rule
        request.routed(rule.rule if rule is not None else UNMATCHED)
