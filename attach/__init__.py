"""``fleetflame attach``: profiles a process that cannot import the sampler, with py-spy.

It runs ``py-spy record --format raw`` in short windows against the process, accumulates the
counts, and serves the sampler's own endpoints (``/profile.json``, ``/stacks``,
``/flamegraph.svg``, ``/info``) through the sampler's WSGI app and HTTP server, so the collector
polls it like any worker. py-spy needs ptrace access to the process; when it is denied the
command says which permission is missing and exits with status 3.
"""

from __future__ import annotations

from attach.agent import Attacher, serve
from attach.cli import main
from attach.pyspy import AttachError, convert_raw, find_process, permission_help

__all__ = [
    "AttachError",
    "Attacher",
    "convert_raw",
    "find_process",
    "main",
    "permission_help",
    "serve",
]
