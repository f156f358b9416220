"""The write path: a bounded buffer of deltas and the thread that writes them, in pieces.

Polls hand each target's part (its rows and the cursor update that produced them) to
``Writer.put``; the writer thread writes queued parts in pieces of at most ``piece_rows`` rows,
one transaction each, as soon as a round ends or a piece's worth is queued. Rows and their
cursor update always commit together, so:

- the database up: nothing is ever dropped. A round larger than the buffer (the first poll
  of a large fleet, when every count is new) is written in pieces while it is polled, and a
  poll whose part does not fit waits for the writer (back-pressure), so the rounds slow down
  to what the database takes;
- the database unreachable or locked: polling goes on and parts queue in memory, bounded by
  ``max_rows``; past the bound the oldest rows are dropped (counted and logged) but their
  cursor updates are folded into the next part of the same target, so what is written later
  is never counted twice. Writes are retried every ``retry_seconds`` and when a round ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from collector.deltas import Part, merge_cursor_updates
from collector.health import Metrics
from collector.logs import log_event
from collector.store import CursorUpdate, InvalidRow, Store, StoreError, StoreUnavailable

__all__ = ["Writer"]

log = logging.getLogger("collector.writer")

_PIECE_ROWS = 250_000  # rows per transaction at most: large enough for one round of most fleets
_TRIM_ROWS = 10_000  # a flush writing this many rows gives the memory it freed back (~1 ms)


class Writer:
    """Writes queued parts to the store, on its own thread or in the caller's (``flush``)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        max_rows: int,
        retry_seconds: float,
        on_refused: Callable[[str], None],
        db_lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.max_rows = max_rows
        self.piece_rows = max(1, min(max_rows // 4, _PIECE_ROWS))
        self.retry_seconds = retry_seconds
        self.db_lock = db_lock or threading.Lock()  # one database operation at a time
        self._on_refused = on_refused  # a target whose delta the store refused: reload it
        self._clock = clock
        self._queue: deque[tuple[float, Part]] = deque()  # (when it was polled, part)
        self._rows = 0  # rows queued or being written
        self.most_rows = 0  # the most rows held at once
        self._writing_since: float | None = None  # poll time of the oldest part being written
        self._cond = threading.Condition()
        self._wanted = False  # a round ended: write what is queued
        self._closing = False
        self._thread: threading.Thread | None = None
        self.database_up = True

    @property
    def buffered_rows(self) -> int:
        """Sample rows queued in memory or being written."""
        return self._rows

    def lag(self) -> float:
        """Age in seconds of the oldest delta not yet written (0 when none)."""
        with self._cond:
            oldest = [t for t in (self._writing_since,) if t is not None]
            oldest += [self._queue[0][0]] if self._queue else []
        return max(0.0, self._clock() - min(oldest)) if oldest else 0.0

    # Polls' side ------------------------------------------------------------------------------

    def put(self, part: Part, polled: float) -> None:
        """Queues a part; waits while the buffer is full and the database takes writes."""
        with self._cond:
            while (
                self._rows
                and self._rows + part.rows > self.max_rows
                and self.database_up
                and self._thread is not None
                and not self._closing
            ):
                self._wanted = True  # write what is queued: this poll is waiting for room
                self._cond.notify_all()
                self._cond.wait(1.0)
            self._queue.append((polled, part))
            self._rows += part.rows
            self.most_rows = max(self.most_rows, self._rows)
            if self._rows >= self.piece_rows:
                self._cond.notify_all()
            inline = self._rows > self.max_rows and self._thread is None
        if inline and self.database_up:
            self.flush()  # no writer thread (one cycle at a time): write in this thread
        with self._cond:
            if self._rows > self.max_rows and not self.database_up:
                self._drop_oldest()
        self._update_gauges()

    def round_done(self) -> None:
        """Asks the writer thread to write what is queued now."""
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def _drop_oldest(self) -> None:
        """Drops the oldest queued rows past ``max_rows``, keeping their cursor updates."""
        dropped_rows = dropped_samples = 0
        kept: deque[tuple[float, Part]] = deque()
        while self._rows > self.max_rows and self._queue:
            polled, part = self._queue.popleft()
            if not part.rows:
                kept.append((polled, part))
                continue
            rows, samples = part.drop_rows()
            self._rows -= rows
            dropped_rows += rows
            dropped_samples += samples
            newer = next((p for _, p in self._queue if p.target == part.target), None)
            if newer is not None:
                newer.carry(part)
            else:
                kept.append((polled, part))
        self._queue.extendleft(reversed(kept))
        if dropped_rows:
            self.metrics.inc("fleetflame_collector_dropped_rows_total", dropped_rows)
            log_event(
                log,
                logging.ERROR,
                "write buffer full; dropped the oldest sample rows",
                rows=dropped_rows,
                samples=dropped_samples,
                limit=self.max_rows,
            )

    # Writing --------------------------------------------------------------------------------

    def flush(self) -> bool:
        """Writes everything queued, oldest first, in pieces; False if some is left (database down)."""
        written = pieces = 0
        started = time.monotonic()
        try:
            with self.db_lock:
                while piece := self._take_piece():
                    left = self._write_piece(piece)
                    if left:
                        self._give_back(left)
                        return False
                    written += sum(part.rows for _, part in piece)
                    pieces += 1
                    with self._cond:
                        self._writing_since = None
                return True
        finally:
            self._update_gauges()
            if written:
                log_event(
                    log,
                    logging.INFO,
                    "deltas written",
                    rows=written,
                    pieces=pieces,
                    write_s=round(time.monotonic() - started, 3),
                    buffered_rows=self._rows,
                )
            if written >= _TRIM_ROWS:
                _give_memory_back()

    def _take_piece(self) -> list[tuple[float, Part]]:
        with self._cond:
            piece: list[tuple[float, Part]] = []
            rows = 0
            while self._queue and (not piece or rows + self._queue[0][1].rows <= self.piece_rows):
                item = self._queue.popleft()
                piece.append(item)
                rows += item[1].rows
            if piece:
                self._writing_since = piece[0][0]
            return piece

    def _give_back(self, items: list[tuple[float, Part]]) -> None:
        with self._cond:
            self._queue.extendleft(reversed(items))
            self._writing_since = None
            self._cond.notify_all()  # the database is down: waiting polls may queue (and drop)

    def _done(self, parts: list[Part]) -> None:
        with self._cond:
            self._rows -= sum(part.rows for part in parts)
            self._cond.notify_all()

    def _write_piece(self, piece: list[tuple[float, Part]]) -> list[tuple[float, Part]]:
        """Writes a piece in one transaction; returns what is left to write later."""
        parts = [part for _, part in piece]
        # Rows made as the store reads them: a piece's rows never all exist at once (250,000
        # row objects at once left ~80 MB of the allocator's arenas behind after each piece).
        rows = (row for part in parts for row in part.sample_rows())
        started = time.monotonic()
        try:
            self.store.write(rows, _cursor_updates(parts))
        except StoreUnavailable as exc:
            self._set_up(False)
            log_event(
                log,
                logging.WARNING,
                "database unavailable; keeping deltas in memory",
                error=str(exc),
                buffered_rows=self._rows,
            )
            return piece
        except InvalidRow as exc:
            log_event(
                log,
                logging.ERROR,
                "store refused a batch; writing target by target",
                error=str(exc),
            )
            return self._write_each(piece)
        except StoreError as exc:
            self._set_up(False)
            log_event(log, logging.ERROR, "store write failed; will retry", error=str(exc))
            return piece
        self._written(parts, time.monotonic() - started)
        return []

    def _write_each(self, piece: list[tuple[float, Part]]) -> list[tuple[float, Part]]:
        """Writes a refused piece one part at a time, setting aside only the bad targets."""
        items = list(piece)
        while items:
            part = items[0][1]
            rows = part.sample_rows()
            started = time.monotonic()
            try:
                self.store.write(rows, [part.cursor_update()])
            except InvalidRow as exc:
                # Forget this delta and re-read the target's cursor from the store, so its
                # samples are computed again from what the database holds: nothing is counted
                # twice, and nothing is lost if the target's next snapshot is sane.
                log_event(
                    log,
                    logging.ERROR,
                    "store refused a target's delta; re-reading its cursor",
                    target=part.target,
                    rows=len(rows),
                    error=str(exc),
                )
                self._done([p for _, p in items if p.target == part.target])
                items = [item for item in items if item[1].target != part.target]
                self._on_refused(part.target)
                continue
            except StoreError as exc:
                self._set_up(False)
                log_event(log, logging.WARNING, "store write failed; will retry", error=str(exc))
                return items
            self._written([part], time.monotonic() - started)
            items.pop(0)
        return []

    def discard(self, target: str) -> None:
        """Drops the queued parts of one target (the store refused its delta)."""
        with self._cond:
            gone = [p for _, p in self._queue if p.target == target]
            self._queue = deque((t, p) for t, p in self._queue if p.target != target)
        self._done(gone)

    def _written(self, parts: list[Part], seconds: float) -> None:
        rows, samples = sum(p.rows for p in parts), sum(p.samples for p in parts)
        self._done(parts)
        self._set_up(True)
        self.metrics.inc("fleetflame_collector_rows_written_total", rows)
        self.metrics.inc("fleetflame_collector_samples_written_total", samples)
        self.metrics.observe("fleetflame_collector_write_seconds", seconds)

    def _set_up(self, up: bool) -> None:
        self.database_up = up
        self.metrics.set("fleetflame_collector_database_up", int(up))
        if not up:
            with self._cond:
                self._cond.notify_all()

    def _update_gauges(self) -> None:
        self.metrics.set("fleetflame_collector_buffered_rows", self._rows)
        self.metrics.set("fleetflame_collector_lag_seconds", round(self.lag(), 3))

    # The thread -----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the writer thread."""
        self._thread = threading.Thread(target=self._run, name="fleetflame-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        retry_at = 0.0
        while True:
            with self._cond:
                while not self._closing and not self._due(retry_at):
                    self._cond.wait(self._wait_seconds(retry_at))
                if self._closing:
                    return
                self._wanted = False
            if not self.flush():
                retry_at = time.monotonic() + self.retry_seconds

    def _due(self, retry_at: float) -> bool:
        if not self._queue:
            return False
        if not self.database_up:
            return self._wanted or time.monotonic() >= retry_at
        return self._wanted or self._rows >= self.piece_rows

    def _wait_seconds(self, retry_at: float) -> float | None:
        if self._queue and not self.database_up:
            return max(0.01, retry_at - time.monotonic())
        return None

    def stop(self) -> None:
        """Lets waiting polls through and ends the thread; ``flush`` writes what is left."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _give_memory_back() -> None:
    """Returns the C heap freed by a large write to the system (glibc); elsewhere a no-op.

    Rows pass through the database driver as many short-lived objects; glibc keeps what they
    freed in the process (measured: ~40 MB after a first round of 50 targets x 2,000 stacks,
    ~60 MB after 200) unless asked to give it back.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (ImportError, OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def _cursor_updates(parts: list[Part]) -> list[CursorUpdate]:
    """One cursor update per target: consecutive parts of a target fold into one."""
    merged: dict[str, CursorUpdate] = {}
    for part in parts:
        update = part.cursor_update()
        earlier = merged.get(part.target)
        merged[part.target] = update if earlier is None else merge_cursor_updates(earlier, update)
    return list(merged.values())
