"""Warming the stack index after a start, so the first views are as fast as later ones.

A process's stack index is empty when it starts, and the first view of a window of many
distinct stacks then reads and sorts all their text (a second or more for 200,000 stacks).
A Warmer reads the stacks sampled in the last hours into the index on a daemon thread: an
hour at a time, newest first, each hour one short read, until 80% of the index's bound
is used. Requests go on meanwhile and learn what they need themselves.
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
HOUR = 3600
CHUNK = 50_000  # stacks learned at a time: a request needing the index waits for one at most
# Of the index's bound: the rest is room for windows older than the warm-up's.
SHARE = 0.8
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
        """Asks the thread to stop after the hour or chunk it is reading, and waits for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                _log.warning("stack index warm-up still running %g s after it was stopped", timeout)

    def _run(self) -> None:
        began = time.monotonic()
        try:
            self._warm()
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

    def _warm(self) -> None:
        now = int(self.clock())
        end = now + self.bucket_seconds  # the bucket being written counts too
        oldest = now - int(self.hours * HOUR)
        seen: set[int] = set()
        batch: list[int] = []
        for hour_end in range(end, oldest, -HOUR):
            if self._stop.is_set():
                return
            ids = self.query.recent_stacks(max(hour_end - HOUR, oldest), hour_end)
            batch += [sid for sid in ids if sid not in seen]
            seen.update(ids)
            last = hour_end - HOUR <= oldest
            if len(batch) >= CHUNK or (last and batch):
                learned, room = self.index.warm(
                    batch, share=SHARE, chunk=CHUNK, stop=self._stop.is_set
                )
                self.learned += learned
                batch = []
                if not room:
                    return
