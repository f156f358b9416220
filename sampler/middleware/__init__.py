"""Middleware that times each request per route and labels its samples with the route.

One line to add::

    import sampler.middleware

    app.wsgi_app = sampler.middleware.WSGIMiddleware(app.wsgi_app)  # Flask (or any WSGI app)
    app.add_middleware(sampler.middleware.ASGIMiddleware)  # Starlette, FastAPI (or any ASGI app)
    MIDDLEWARE = ["sampler.middleware.django.Middleware", ...]  # Django, first in the list

Each request's latency, its queueing delay (from an ``X-Request-Start`` or ``X-Queue-Start``
header set by the proxy) and, for the slowest, the stacks sampled while it ran are served at
``/requests.json`` (docs/worst-cases.md). No framework is imported: each is recognized by what
its objects have.
"""

from __future__ import annotations

from ._asgi import ASGIMiddleware
from ._wsgi import WSGIMiddleware

__all__ = ["ASGIMiddleware", "WSGIMiddleware"]
