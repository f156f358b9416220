"""Serving an app with gunicorn or uvicorn on 127.0.0.1: their command lines, and a stop.

Used by bench/bench_middleware.py and the middleware tests (tests/middleware/mwhelpers.py).
A command leaves the port as ``{port}``, for the caller to fill in once it has picked one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["gunicorn", "stop", "uvicorn"]

BIN = Path(sys.executable).parent


def gunicorn(
    app: str, *, workers: int = 1, worker_class: str = "sync", threads: int = 1, backlog: int
) -> list[str]:
    """gunicorn serving ``app`` (``module:name``) with these workers."""
    return [
        str(BIN / "gunicorn"),
        "--bind",
        "127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        worker_class,
        "--threads",
        str(threads),
        "--backlog",
        str(backlog),
        app,
    ]


def uvicorn(app: str) -> list[str]:
    """uvicorn serving the ASGI ``app`` (``module:name``), access log off."""
    return [
        str(BIN / "python"),
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--no-access-log",
        "--log-level",
        "warning",
        "--backlog",
        "2048",
        app,
    ]


def stop(process: subprocess.Popen[Any]) -> None:
    """Stops a server started in a session of its own (``start_new_session=True``): SIGTERM to
    its process group, SIGKILL if it still runs 20 seconds later."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
