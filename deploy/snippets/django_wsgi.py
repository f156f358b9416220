"""``wsgi.py`` of a Django project instrumented with fleetflame.

Copy it over ``mysite/wsgi.py`` (adjust DJANGO_SETTINGS_MODULE) and add
``"mysite.wsgi.FleetflameRouteMiddleware"`` at the top of ``MIDDLEWARE`` to label samples
with the URL pattern. The sampler starts only when ``FLEETFLAME_PORT`` (or
``FLEETFLAME_ENABLE``) is set; under gunicorn with ``deploy/gunicorn.conf.py`` the
``post_fork`` hook has started it already and the call below is a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from django.core.wsgi import get_wsgi_application
from django.urls import Resolver404, resolve

import sampler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
sampler.start_from_env()


class FleetflameRouteMiddleware:
    """Labels the samples of each request with its URL pattern (``route=users/<int:id>/``)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        try:
            route = resolve(request.path_info).route or "unnamed"
        except Resolver404:
            route = "unmatched"
        with sampler.tag(route=route):
            return self.get_response(request)


# Last: building the handler loads MIDDLEWARE, which may name the class above.
application = get_wsgi_application()
