"""The WSGI middleware; on a Flask app it also names requests by their URL rule.

Its per-request work is in C where the native extension is built (``WSGIWrapper`` in
sampler/_native_src/wsgi_wrapper.c: no Python frame of ours runs in a request), and in Python
here otherwise, step for step the same.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time

from .. import _requests
from .._labels import RouteTag, native_route_tags
from .._log import log
from .._requests import MAX_PENDING, UNMATCHED, recorder

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

# Where a request's state waits in its environ for the framework's routing hook.
KEY = "fleetflame.request"
# Flask's request context variable (Flask 2.2+), once a Flask app is wrapped; before 2.2 one
# that is never set.
_flask_request_context: contextvars.ContextVar[Any] = contextvars.ContextVar("fleetflame_unset")


class _Request:
    """One request in flight: its tag, its route once known, its status; it also passes the
    app's ``start_response`` and body through, and is timed until the body is closed."""

    __slots__ = (
        "tag",
        "route",
        "status",
        "started",
        "header",
        "wall",
        "environ",
        "default",
        "start_response",
        "body",
        "iterator",
        "tag_closed",
        "green",
    )
    tag: RouteTag
    default: str  # the route until routed

    def __init__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> None:
        self.started = time.monotonic()
        header = environ.get("HTTP_X_REQUEST_START") or environ.get("HTTP_X_QUEUE_START")
        self.header = header
        self.wall = time.time() if header else 0.0
        self.environ: dict[str, Any] | None = environ
        self.start_response = start_response
        self.status: str | int = 0
        self.route: str | None = None
        self.body: Any = None
        self.iterator: Any = None
        self.tag_closed = False
        # On a greenlet (gevent's, eventlet's): requests take turns on its OS thread, so its
        # stacks are its route's samples, and a streamed body's chunks are tagged too.
        self.green = _requests.on_greenlet()

    def routed(self, template: str) -> None:
        """Names the request after its route template, from now on (its samples too)."""
        self.route = recorder.route_name(template)
        if not self.tag_closed:  # a late call names the request, tags no frame
            self.tag.route(self.route)

    def start(self, status: str, headers: Any, exc_info: Any = None) -> Any:
        """The ``start_response`` the app is given."""
        self.status = status
        return self.start_response(status, headers, exc_info)

    def __iter__(self) -> Iterator[bytes]:
        # The request is the iterator the server reads (as in C): a generator here would close
        # the body when the server drops it, and the server's close() would close it again.
        if self.iterator is None:
            self.iterator = iter(self.body)
        return self

    def __next__(self) -> bytes:
        if self.iterator is None:
            raise StopIteration
        # A streamed body's work is the request's: its samples carry the route while it makes
        # a chunk (under greenlets a slow request's stacks are its route's samples).
        tag = None
        if self.route is not None and self.green:
            tag = RouteTag(sys._getframe(0))
            tag.route(self.route)
        try:
            return next(self.iterator)  # type: ignore[no-any-return]
        except StopIteration:
            raise
        except BaseException:
            self.status = 0  # the answer broke off: a failed request, as if the app raised
            raise
        finally:
            if tag is not None:
                tag.close()

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.finish()

    def finish(self) -> None:
        """Hands the finished request to the recorder."""
        environ = self.environ
        if environ is None:
            return  # handed over already
        # The environ holds this request (for the routing hook), and the body may hold the
        # environ: let go of both, so the cycle's objects are freed now, not by a collection.
        self.environ = self.body = self.iterator = None
        recorder.finish(
            (
                self.route or self.default,
                self.started,
                time.monotonic() - self.started,
                self.header,
                self.wall,
                threading.get_ident(),
                self.green,  # taking turns on its OS thread: found by its route
                self.status,
                environ.get("PATH_INFO") or "/",
            )
        )


class PythonWSGIMiddleware:
    """The WSGI middleware in Python: where the native extension is not built, and for a call
    with no Python frame to tag (uWSGI's and mod_wsgi's, from C)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self._routed = _hook_routing(app)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        request = _Request(environ, start_response)
        request.tag = tag = RouteTag(sys._getframe(0))
        if self._routed:
            request.default = UNMATCHED  # the tag opens once routed
        else:
            route = recorder.route_name(environ.get("PATH_INFO") or "/", raw=True)
            request.route = request.default = route
            tag.route(route)
        environ[KEY] = request
        try:
            body = self.app(environ, request.start)
        except BaseException:
            request.status = 0
            request.finish()
            raise
        finally:
            tag.close()
            request.tag_closed = True
        wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(wrapper, type) and isinstance(body, wrapper):
            # Left as is, so the server can still send the file its own way (sendfile).
            request.finish()
            return body  # type: ignore[return-value]
        request.body = body
        return request


def _hook_routing(app: Callable[..., Any]) -> bool:
    """Whether the app routes requests itself and a hook now names them by their route: a
    Flask app's ``wsgi_app`` (or the app), recognized by what it has."""
    owner: Any = getattr(app, "__self__", app)
    if not _is_flask(owner):
        return False
    global _flask_request_context
    flask_globals = getattr(sys.modules.get("flask"), "globals", None)
    _flask_request_context = getattr(flask_globals, "_cv_request", _flask_request_context)
    owner.before_request(_flask_routed)
    return True


def _route_by_request_class(app: Callable[..., Any], routed_attribute: Any) -> bool:
    """Whether the app routes requests itself, Flask's way, and now names them as it does: its
    request class is given attributes that see Flask set ``url_rule`` (or
    ``routing_exception``), so no before_request hook runs (Flask's dispatch of one costs
    ~5,000 instructions a request)."""
    owner: Any = getattr(app, "__self__", app)
    base = getattr(owner, "request_class", None)
    if not (_is_flask(owner) and isinstance(base, type)):
        return False
    if not getattr(base, "_fleetflame_routed", False):
        owner.request_class = type(
            base.__name__,
            (base,),
            {
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "__doc__": base.__doc__,
                "_fleetflame_routed": True,
                "url_rule": routed_attribute("url_rule", True, UNMATCHED),
                "routing_exception": routed_attribute("routing_exception", False, UNMATCHED),
            },
        )
    return True


def _is_flask(owner: Any) -> bool:
    return callable(getattr(owner, "before_request", None)) and hasattr(owner, "url_map")


if native_route_tags() is None:
    WSGIMiddleware: type[Any] = PythonWSGIMiddleware
else:
    from .. import _native

    class WSGIMiddleware(_native.WSGIWrapper):  # type: ignore[no-redef]
        """Wraps a WSGI app: ``app.wsgi_app = WSGIMiddleware(app.wsgi_app)``.

        Given a Flask app's ``wsgi_app`` (or the app), requests are named by their URL rule
        (``/users/<int:id>``); any other app's by their path, the first ``MAX_RAW_PATHS`` of
        them.
        """

        def __init__(self, app: Callable[..., Any]) -> None:
            routed = _route_by_request_class(app, _native.RoutedAttribute)
            super().__init__(
                app,
                routed,
                recorder,
                PythonWSGIMiddleware.__call__,
                UNMATCHED,
                MAX_PENDING,
            )

        def _unrouted(self) -> None:
            # A request ended with no word from Flask's routing: its request class was
            # replaced after this wrapped the app. Flask takes no hook once it has served, so
            # the new class is given the attributes in turn.
            log.warning(
                "fleetflame: Flask did not say which URL rule a request matched (was "
                "app.request_class replaced after the middleware wrapped the app?); its "
                "request class now tells the middleware again"
            )
            _route_by_request_class(self.app, _native.RoutedAttribute)


def _flask_routed() -> None:
    # A before_request function: Flask has matched the URL rule (or failed to) by now. The
    # request context's variable directly (Flask 2.2+): its proxies cost ~2 us a look-up.
    context = _flask_request_context.get(None)
    flask_request = context.request if context is not None else sys.modules["flask"].request
    request = flask_request.environ.get(KEY)
    if request is not None and request.route is None:
        rule = flask_request.url_rule
        request.routed(rule.rule if rule is not None else UNMATCHED)
