"""How the stall watcher times a call (an asyncio callback, a WSGI server's request): a wrapper
that keeps the call in the watcher's running calls (thread ident -> (kind, started)) and tells
the watcher of one past its limit. The extension's C type TimedCall where it is built
(sampler/_native_src/timed.c: no frame at all, 0.11 us a call against 0.28), else the Python
wrapper below, whose code the engines leave out of every walk.
"""

from __future__ import annotations

import os
import threading
import time

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._stalls import StallWatcher


def limit_attribute(kind: str) -> str:
    """The watcher's attribute holding a kind of call's limit (read at each call)."""
    return "request_threshold" if kind == "request" else "threshold"


def timed(original: Any, kind: str, watcher: StallWatcher, describe: Any) -> Any:
    """A wrapper of the method ``original`` that times each call: C where it is built (tests
    turn that off with FLEETFLAME_PYTHON_TIMING=1 to check the Python wrapper)."""
    native = _native()
    if native is not None:
        return native.TimedCall(
            original,
            kind,
            watcher._running,
            watcher,
            limit_attribute(kind),
            watcher.finished,
            describe,
        )
    wrapper = python_timed(original, kind, watcher, describe)
    from ._stack_walk import hide_code

    hide_code(wrapper.__code__, watcher._sampler.engine.name)
    return wrapper


def _native() -> Any:
    if os.environ.get("FLEETFLAME_PYTHON_TIMING") == "1":
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "TimedCall") else None


def python_timed(original: Any, kind: str, watcher: StallWatcher, describe: Any) -> Any:
    """Wraps a method so each call is timed; one past the threshold is a stall. Every wrapper
    has this function's code object, which the engines hide from their walks."""
    running = watcher._running
    get_ident, monotonic = threading.get_ident, time.monotonic

    def timed(*args: Any, **kwargs: Any) -> Any:
        ident = get_ident()
        outer = running.get(ident)
        started = monotonic()
        running[ident] = (kind, started)
        try:
            return original(*args, **kwargs)
        finally:
            if outer is None:
                running.pop(ident, None)
            else:
                running[ident] = outer
            elapsed = monotonic() - started
            if elapsed > watcher.limit(kind):
                watcher.finished(kind, ident, started, elapsed, describe(args))

    timed.__wrapped__ = original  # type: ignore[attr-defined]
    timed.__fleetflame_timed__ = True  # type: ignore[attr-defined]
    return timed
