"""How the stall watcher times a call (an asyncio callback, a WSGI server's request): a wrapper
that keeps the call in the watcher's running calls (thread ident -> (kind, started)) and tells
the watcher of one past its limit. The extension's C types where it is built
(sampler/_native_src/timed.c and running_calls.c: no frame, no object a call), else the Python
wrapper below and a dict, whose code the engines leave out of every walk.
"""

from __future__ import annotations

import os
import threading
import time

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._stalls import StallWatcher


class Limit:
    """A watcher's limit for one kind of call, in seconds: an attribute whose value is kept in
    the watcher's ``_limits`` (kind -> seconds, what the Python wrapper reads) and, for the C
    timing, in its running calls' table, so a call reads no attribute."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __get__(self, watcher: Any, owner: type | None = None) -> Any:
        return self if watcher is None else watcher._limits[self.kind]

    def __set__(self, watcher: Any, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:  # NaN too: watch_wait refuses either, and the watcher's loop ended
            raise ValueError(f"a stall limit is seconds, 0 or more (inf: none), not {seconds!r}")
        running = watcher._running  # the watcher makes it and _limits first
        if not isinstance(running, dict):
            running.set_limit(self.kind, seconds)
        watcher._limits[self.kind] = seconds


def running_calls() -> Any:
    """A watcher's table of running calls: the C one where TimedCall is used, else a dict."""
    native = _native()
    return native.RunningCalls() if native is not None else {}


def timed(original: Any, kind: str, watcher: StallWatcher, describe: Any) -> Any:
    """A wrapper of the method ``original`` that times each call: C where it is built (tests
    turn that off with FLEETFLAME_PYTHON_TIMING=1 to check the Python wrapper)."""
    if not isinstance(watcher._running, dict):  # the table decided, as the watcher was made
        from . import _native as native

        return native.TimedCall(original, kind, watcher._running, watcher.finished, describe)
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
    running, limits = watcher._running, watcher._limits
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
            if elapsed > limits[kind]:
                watcher.finished(kind, ident, started, elapsed, describe(args))

    # The method's name, module and doc (functools.wraps's), as the C type reports them.
    for name in ("__name__", "__qualname__", "__module__", "__doc__"):
        try:
            setattr(timed, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    timed.__wrapped__ = original  # type: ignore[attr-defined]
    timed.__fleetflame_timed__ = True  # type: ignore[attr-defined]
    return timed
