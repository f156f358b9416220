"""Warming the stack index after a start, so the first views are as fast as later ones.

A process's stack index is empty when it starts, and the first view of a window of many
distinct stacks then reads and sorts all their text (a second or more for 200,000 stacks).
A Warmer reads the stacks sampled in the last hours into the index on a daemon thread,
most recent first, up to half the index's bound; requests go on meanwhile and learn what
they need themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from collector.query import Query
from collector.store import StoreError
from webui.model import StackIndex

__all__ = ["Warmer"]

THREAD_NAME = "fleetflame-web-warmup"
_log = logging.getLogger(__name__)


class Warmer:
    """Reads the stacks of the last ``hours`` into a stack index on a daemon thread."""

    def __init__(
        self,
        query: Query,
        index: StackIndex,
        *,
        hours: float,
        bucket_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.query = query
        self.index = index
        self.hours = hours
        self.bucket_seconds = bucket_seconds
        self.clock = clock
        self.learned = 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        """Starts warming in the background."""
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until warming has ended (done, failed or stopped); tells whether it has."""
        return self._done.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Asks the thread to stop after the chunk it is reading, and waits for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        began = time.monotonic()
        try:
            now = int(self.clock())
            start = now - int(self.hours * 3600)
            ids = self.query.recent_stacks(start, now + self.bucket_seconds)
            if self._stop.is_set():
                return
            self.learned = self.index.warm(ids, stop=self._stop.is_set)
            _log.info(
                "stack index warmed with %d stacks of the last %g hours in %.1f s",
                self.learned,
                self.hours,
                time.monotonic() - began,
            )
        except StoreError as exc:
            # Not fatal: requests read what they need when they need it.
            _log.warning("could not warm the stack index: %s", exc)
        except Exception:
            _log.exception("could not warm the stack index")
        finally:
            self._done.set()
