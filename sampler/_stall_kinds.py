"""What the stall watcher times, and how each kind of stall is said in words (``what``).

A description is made on the host's thread as a stalled call ends, from the host's objects:
it reads names only (never a repr, which the host's code may make slow or make raise), and
whatever it meets that raises gives ``?``, never an exception in the host.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

# What is timed: (module, class, method) -> (kind, how to say what one call was doing).
TIMED = {
    ("asyncio.events", "Handle", "_run"): ("event-loop", lambda args: _describe(args[0])),
    ("gunicorn.workers.sync", "SyncWorker", "handle_request"): (
        "request",
        lambda args: _request("gunicorn", getattr(args[2], "path", None)),
    ),
    ("gunicorn.workers.gthread", "ThreadWorker", "handle_request"): (
        "request",
        lambda args: _request("gunicorn", getattr(args[1], "path", None)),
    ),
    ("werkzeug.serving", "WSGIRequestHandler", "run_wsgi"): (
        "request",
        lambda args: _request("werkzeug", getattr(args[0], "path", None)),
    ),
    ("wsgiref.handlers", "BaseHandler", "run"): (
        "request",
        lambda args: _request(
            "wsgiref", (getattr(args[0], "environ", None) or {}).get("PATH_INFO")
        ),
    ),
    ("waitress.task", "WSGITask", "execute"): (
        "request",
        lambda args: _request("waitress", getattr(getattr(args[0], "request", None), "path", None)),
    ),
}


def _request(server: str, path: Any) -> str:
    return f"a {server} request" + (f" for {path}"[:200] if isinstance(path, str) else "")


def _describe(handle: Any) -> str:
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and isinstance(task, asyncio.Task):
        return f"a step of task {_name(task.get_coro())}"[:200]
    functools = sys.modules.get("functools")  # asyncio's import: loaded
    if functools is not None and isinstance(callback, functools.partial):
        return f"callback partial({_name(callback.func)})"[:200]
    return f"callback {_name(callback)}"[:200]


def _name(thing: Any) -> str:
    name = getattr(thing, "__qualname__", None)
    return name if isinstance(name, str) else type(thing).__qualname__


def _safely(describe: Any) -> Any:
    def said(args: Any) -> str:
        try:
            return describe(args)  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - the host's objects may raise anything
            return "?"

    return said


TIMED = {key: (kind, _safely(describe)) for key, (kind, describe) in TIMED.items()}


def gil_what(held: float, holder: int | None, on_cpu: float | None, handoffs: int) -> str:
    # What kept the GIL from the watcher: other threads taking turns (contention), one thread
    # running (its code holds the GIL), or one that did not run (blocked in a call that kept
    # the GIL, or waiting for a CPU on an overloaded host), by its CPU clock.
    if handoffs:
        return f"the GIL contended: it changed hands {handoffs} times before the watcher had it"
    if holder is None:
        return "the GIL held (thread unknown)"
    if on_cpu is None or on_cpu >= held / 2:
        return "the GIL held"
    return (
        f"the GIL held by a thread that was not running (it ran {on_cpu * 1000:.0f} of "
        f"{held * 1000:.0f} ms): blocked in a call that kept the GIL, or waiting for a CPU"
    )
