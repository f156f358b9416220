"""Django middleware: ``"sampler.middleware.django.Middleware"`` first in ``MIDDLEWARE``.

Requests are named by their URL pattern (``resolver_match.route``, ``/items/<int:item_id>/``),
known once Django has resolved the URL; samples taken from then on carry it.
"""

from __future__ import annotations

import sys
import threading
import time

from .._labels import route_tag_type
from .._requests import UNMATCHED, on_greenlet, recorder

# In C where the native extension is built: a request's tag costs no Python frame.
RouteTag = route_tag_type()

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# The attribute a request carries its [tag, route] in while it is served.
_ATTRIBUTE = "_fleetflame"


class Middleware:
    """Times each request and names it by its URL pattern (sync only: Django adapts it)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        started = time.monotonic()
        meta = request.META
        header = meta.get("HTTP_X_REQUEST_START") or meta.get("HTTP_X_QUEUE_START")
        wall = time.time() if header else 0.0
        tag = RouteTag(sys._getframe(0))  # opened once Django resolved the URL
        state: list[Any] = [tag, None]
        green = on_greenlet()
        setattr(request, _ATTRIBUTE, state)
        status = 0
        try:
            response = self.get_response(request)
            status = getattr(response, "status_code", 0)
            return response
        finally:
            tag.close()
            recorder.finish(
                (
                    state[1] or UNMATCHED,
                    started,
                    time.monotonic() - started,
                    header,
                    wall,
                    threading.get_ident(),
                    green,  # on a greenlet, taking turns on its OS thread: found by its route
                    status,
                    getattr(request, "path", "") or "/",
                )
            )

    def process_view(self, request: Any, view: Any, args: Any, kwargs: Any) -> None:
        """Names the request after the URL pattern Django resolved."""
        state = getattr(request, _ATTRIBUTE, None)
        route = getattr(getattr(request, "resolver_match", None), "route", None)
        if state is not None and isinstance(route, str):
            state[1] = recorder.route_name("/" + route)
            state[0].route(state[1])
