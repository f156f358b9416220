"""The one small HTTP server fleetflame serves its endpoints with, for the other rooms to use.

The sampler's endpoint, the collector's ``/healthz`` and ``/metrics`` and ``fleetflame attach``
all serve a WSGI app through ``Server`` (``sampler._http``): one event-loop thread, a fixed pool
of workers, a deadline on every request, kept-alive connections for clients that ask, and
``stop()`` that returns at once. Standard library only.
"""

from __future__ import annotations

from ._http import PARK, App, Environ, Server, StartResponse

__all__ = ["PARK", "App", "Environ", "Server", "StartResponse"]
