"""Warming the stack index after a start, so the first views are as fast as later ones.

A process's stack index is empty when it starts, and the first view of a window of many
distinct stacks then reads and sorts all their text (a second or more for 200,000 stacks).
A Warmer reads the stacks sampled in the last hours into the index on a daemon thread: an
hour at a time, newest first, each hour one short read, until 80% of the index's bound
is used; then the same stacks' functions into the function index (webui.functable), so the
first function table is as fast too. Requests go on meanwhile and learn what they need
themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from collector.query import Query
from collector.store import StoreError
from webui.functable import FunctionIndex
from webui.model import StackIndex

__all__ = ["Warmer"]

THREAD_NAME = "fleetflame-web-warmup"
HOUR = 3600
CHUNK = 50_000  # stacks learned at a time: a request needing the index waits for one at most
FUNCTION_CHUNK = 5_000  # stacks whose functions are numbered at a time (~20 ms)
IDLE_WAIT = 0.05  # seconds between looks for a moment without requests
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
        functions: FunctionIndex | None = None,
        clock: Callable[[], float] = time.time,
        idle: Callable[[], bool] = lambda: True,
    ) -> None:
        self.query = query
        self.index = index
        self.functions = functions
        self.idle = idle  # whether no request is being served
        self.hours = hours
        self.bucket_seconds = bucket_seconds
        self.clock = clock
        self.learned = 0
        self.functions_learned = 0
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
                "stack index warmed with %d stacks of the last %g hours in %.1f s "
                "(their functions: %d)",
                self.learned,
                self.hours,
                time.monotonic() - began,
                self.functions_learned,
            )
        except StoreError as exc:
            # Not fatal: requests read what they need when they need it.
            _log.warning("could not warm the stack index: %s", exc)
        except Exception:
            _log.exception("could not warm the stack index")
        finally:
            self._done.set()

    def _learn_functions(self, ids: list[int]) -> None:
        """Numbers the functions of the stacks warmed, most recent first, as far as the
        function index holds them without starting over; in small chunks, so that requests
        meanwhile wait little for the interpreter."""
        assert self.functions is not None
        for i in range(0, len(ids), FUNCTION_CHUNK):
            # Only while no request is served: a first view must not share the interpreter
            # with this (it draws without the function table).
            while not self.idle() and not self._stop.wait(IDLE_WAIT):
                pass
            if self._stop.is_set():
                return
            if not self.functions.warm(ids[i : i + FUNCTION_CHUNK], share=SHARE):
                return
            self.functions_learned = min(len(ids), i + FUNCTION_CHUNK)

    def _warm(self) -> None:
        now = int(self.clock())
        end = now + self.bucket_seconds  # the bucket being written counts too
        oldest = now - int(self.hours * HOUR)
        warmed = self._warm_stacks(end, oldest)
        # Functions second: a view's tree needs the stack index, its table comes after it.
        if self.functions is not None:
            self._learn_functions(warmed)

    def _warm_stacks(self, end: int, oldest: int) -> list[int]:
        """Learns the stacks of [oldest, end), an hour at a time, newest first; returns the
        ids learned (or offered to the index), in that order."""
        seen: set[int] = set()
        batch: list[int] = []
        warmed: list[int] = []
        for hour_end in range(end, oldest, -HOUR):
            if self._stop.is_set():
                break
            ids = self.query.recent_stacks(max(hour_end - HOUR, oldest), hour_end)
            batch += [sid for sid in ids if sid not in seen]
            seen.update(ids)
            last = hour_end - HOUR <= oldest
            if len(batch) >= CHUNK or (last and batch):
                learned, room = self.index.warm(
                    batch, share=SHARE, chunk=CHUNK, stop=self._stop.is_set
                )
                self.learned += learned
                warmed += batch
                batch = []
                if not room:
                    break
        return warmed
