"""Pausing Python's cyclic garbage collector while a large profile is read and pruned.

The request handlers that read large windows (webui.api, webui.history, webui.significance)
run inside ``paused_gc()``: a window's many row tuples would otherwise trigger full
collections that walk every object of the process. Pauses of overlapping requests nest, and
the collector runs again after _GC_MAX_PAUSE seconds whatever they do.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_paused_at: float | None = None  # when this module disabled the collector, if it did
# Under steady load pauses overlap; the collector runs again after this long regardless.
_GC_MAX_PAUSE = 5.0


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pauses the cyclic garbage collector while a large profile is read and pruned.

    Reading a window of 200,000 stacks makes as many row tuples, which live for the whole
    request: each full collection they trigger walks every object of the process (up to 0.2 s
    per request). Nothing here makes cycles. Collection resumes when the last pauser is done,
    or when one is done and it has been paused for _GC_MAX_PAUSE seconds, so overlapping
    requests cannot keep it off.
    """
    global _gc_pausers, _gc_paused_at
    with _gc_lock:
        _gc_pausers += 1
        if _gc_pausers == 1 and gc.isenabled():
            gc.disable()
            _gc_paused_at = time.monotonic()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_paused_at is not None and (
                _gc_pausers == 0 or time.monotonic() - _gc_paused_at > _GC_MAX_PAUSE
            ):
                gc.enable()
                _gc_paused_at = None
